"""The frontend tokenizer against the real default model (vocab only: loads in a second)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from tinyserve.config import build_config
from tinyserve.frontend.tokenizer import Tokenizer


@pytest.fixture
async def tokenizer() -> AsyncIterator[Tokenizer]:
    loaded = await Tokenizer.load(build_config({}, environ={}))
    yield loaded
    loaded.close()


async def test_tokenizes_to_ids(tokenizer: Tokenizer) -> None:
    ids = await tokenizer.tokenize("The capital of France is")
    assert ids and all(isinstance(i, int) and i >= 0 for i in ids)


async def test_same_text_same_ids(tokenizer: Tokenizer) -> None:
    first = await tokenizer.tokenize("héllo wörld 😀")
    assert first == await tokenizer.tokenize("héllo wörld 😀")
    assert first != await tokenizer.tokenize("goodbye")


async def test_special_tokens_are_parsed(tokenizer: Tokenizer) -> None:
    # SmolLM2's chat template uses <|im_start|>: one token, not its characters.
    plain = await tokenizer.tokenize("hello")
    special = await tokenizer.tokenize("<|im_start|>hello")
    assert len(special) == len(plain) + 1


async def test_loop_stays_responsive_while_tokenizing(tokenizer: Tokenizer) -> None:
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    # Were tokenize() to run on the loop, the ticker could not run before it returned.
    task = asyncio.create_task(ticker())
    await tokenizer.tokenize("word " * 50_000)
    task.cancel()
    assert ticks > 1
