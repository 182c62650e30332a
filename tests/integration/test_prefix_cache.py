"""The prefix cache on a real node: the interleaving of issue 11 (the same prompt twice at
once, then an extension of it), which once made the engine exit, is served, the extension
reusing the prompt."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import aiohttp
import pytest

from .node import Node, generate

pytestmark = pytest.mark.integration

# 25 tokens: one full 16-token block before the last token, so it can be cached and hit.
PROMPT = (
    "The old lighthouse keeper climbed the narrow stone stairs every evening to light the great "
    "brass lamp above the harbour while the gulls slept"
)


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    running = Node(tmp_path_factory.mktemp("prefix_cache"), "--slots", "2").start()
    yield running
    assert running.stop() == 0


def sampled(max_tokens: int, seed: int, prompt: str = PROMPT) -> dict[str, object]:
    return {
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 1.0,
        "seed": seed,
        "ignore_eos": True,
    }


async def test_same_prompt_twice_then_an_extension_keeps_the_engine_serving(node: Node) -> None:
    async with aiohttp.ClientSession() as s:
        # Both are granted a slot before either stores its blocks; the short one stores
        # first, the long one then adds only what the cache does not hold yet.
        replies = await asyncio.gather(
            generate(s, node.url, **sampled(30, seed=1)),
            generate(s, node.url, **sampled(12, seed=2)),
        )
        assert [(status, r["finish_reason"]) for status, r in replies] == [(200, "length")] * 2
        # Its prompt starts with the shared block: a hit on what the long one parked.
        status, extended = await generate(
            s, node.url, **sampled(8, seed=3, prompt=PROMPT + ". One night")
        )
        assert status == 200, extended
        assert extended["finish_reason"] == "length", extended
        # All of the shared prompt (25 tokens), and never the whole of the extension.
        assert 25 <= extended["usage"]["cached_tokens"] < extended["usage"]["prompt_tokens"]
        status, after = await generate(s, node.url, prompt="Once upon a time", max_tokens=4)
        assert status == 200, after
        async with s.get(node.url + "/ready") as resp:
            assert resp.status == 200, await resp.text()
