"""The frontend tokenizer against the real default model (vocab only: loads in a second)."""

from __future__ import annotations

import asyncio
import ctypes
import dataclasses
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor

import llama_cpp
import llama_cpp._logger as llama_cpp_logger
import pytest

from tinyserve.config import build_config
from tinyserve.frontend.prompt.tokenizer import Tokenizer


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


async def test_token_pieces_spell_out_special_tokens(tokenizer: Tokenizer) -> None:
    ids = await tokenizer.tokenize("<|im_start|>hello")
    pieces = await tokenizer.token_pieces(ids)
    assert pieces[0] == b"<|im_start|>"
    assert b"".join(pieces[1:]) == b"hello"


async def test_facts_of_the_default_model(tokenizer: Tokenizer) -> None:
    facts = tokenizer.facts
    assert facts.chat_template is not None and "add_generation_prompt" in facts.chat_template
    assert (facts.bos_text, facts.eos_text) == ("<|im_start|>", "<|im_end|>")
    assert facts.model_path.suffix == ".gguf"


class _BosAddingVocab:
    """Stands in for a llama.cpp vocabulary whose model adds BOS (id 1) to every text."""

    def tokenize(self, text: bytes, add_bos: bool, special: bool) -> list[int]:
        ids = [1] if add_bos else []
        return ids + [1 if part == b"<s>" else 7 for part in text.split()]

    def token_bos(self) -> int:
        return 1


async def test_a_template_bos_is_not_doubled(tokenizer: Tokenizer) -> None:
    facts = dataclasses.replace(tokenizer.facts, adds_bos=True)
    with ThreadPoolExecutor(1) as executor:
        adding = Tokenizer(_BosAddingVocab(), executor, facts)  # type: ignore[arg-type]
        assert await adding.tokenize("<s> hi") == [1, 7]
        assert await adding.tokenize("hi") == [1, 7]


async def test_ids_outside_the_vocabulary_are_refused_not_passed_to_llama_cpp(
    tokenizer: Tokenizer,
) -> None:
    # llama.cpp aborts the process (an uncaught C++ std::out_of_range) on such an id: were it
    # passed through, this test's own process would die.
    for bad in ([tokenizer.n_vocab], [5, 1048577], [-1]):
        with pytest.raises(ValueError, match="not in the vocabulary"):
            await tokenizer.detokenize(bad)
        with pytest.raises(ValueError, match="not in the vocabulary"):
            await tokenizer.token_pieces(bad)
    assert await tokenizer.detokenize([tokenizer.n_vocab - 1])  # the last id is fine


async def test_loading_writes_nothing_to_stderr(capfd: pytest.CaptureFixture[str]) -> None:
    # As in a fresh frontend process: llama-cpp-python's log callback until ours is set.
    llama_cpp.llama_log_set(llama_cpp_logger.llama_log_callback, ctypes.c_void_p(0))
    loaded = await Tokenizer.load(build_config({}, environ={}))
    loaded.close()
    assert capfd.readouterr().err == ""
