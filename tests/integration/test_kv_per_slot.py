"""Each sequence attends over its own KV cells, on a real node: a slot's cells are the most a
request may fill, and a conversation's next turn finds its history in the slot that kept it
or in the prefix cache, with the same text whichever served it and whatever else runs."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from .node import Node

pytestmark = pytest.mark.integration

SLOTS, CTX_PER_SLOT = 4, 1024
TOPICS = ["cats", "the sea", "bread", "trains", "winter", "music", "gardens", "stars"]
QUESTIONS = ["Tell me something about {topic}.", "Why is that?", "Say more, briefly."]
MODEL = "SmolLM2-135M-Instruct.Q4_1"  # the default model's id (its file name)
FILLER = 28120  # a token of the default model's vocabulary ("hello")


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    # Flash attention on: a row's logits then do not depend on the batch it came in
    # (tests/engine/conftest.py, exact_runtime), so the same text alone and in the crowd
    # checks the reuse itself, not llama.cpp's summing order.
    flags = ("--slots", str(SLOTS), "--ctx-per-slot", str(CTX_PER_SLOT), "--flash-attn", "on")
    running = Node(tmp_path_factory.mktemp("kv_per_slot"), *flags).start()
    yield running
    assert running.stop() == 0


async def chat(s: aiohttp.ClientSession, url: str, messages: list[dict[str, str]]) -> Any:
    body = {"model": MODEL, "messages": messages, "max_tokens": 32, "temperature": 0.0}
    async with s.post(f"{url}/v1/chat/completions", json=body) as resp:
        reply = await resp.json()
        assert resp.status == 200, reply
        return reply


async def conversation(s: aiohttp.ClientSession, url: str, topic: str) -> list[tuple[str, int]]:
    """Its turns one after another: each reply's text and the prompt tokens it reused."""
    messages: list[dict[str, str]] = [{"role": "system", "content": "You are a helpful guide."}]
    turns = []
    for question in QUESTIONS:
        messages.append({"role": "user", "content": question.format(topic=topic)})
        reply = await chat(s, url, messages)
        text = reply["choices"][0]["message"]["content"]
        messages.append({"role": "assistant", "content": text})
        turns.append((text, reply["usage"]["prompt_tokens_details"]["cached_tokens"]))
    return turns


async def hit_tokens(s: aiohttp.ClientSession, url: str) -> dict[str, float]:
    async with s.get(url + "/metrics") as resp:
        text = await resp.text()
    prefix = "tinyserve_prefix_cache_hit_tokens_total{tier="
    return {
        line.split('"')[1]: float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith(prefix)
    }


async def test_eight_conversations_over_four_slots_get_the_text_each_gets_alone(
    node: Node,
) -> None:
    async with aiohttp.ClientSession() as s:
        alone = [await conversation(s, node.url, topic) for topic in TOPICS]
        before = await hit_tokens(s, node.url)
        together = await asyncio.gather(*(conversation(s, node.url, t) for t in TOPICS))
        after = await hit_tokens(s, node.url)
    for topic, one, crowd in zip(TOPICS, alone, together, strict=True):
        assert [text for text, _ in crowd] == [text for text, _ in one], topic
        # Every later turn reused its history: from the slot that kept it or the cache.
        assert all(cached > 0 for _, cached in crowd[1:]), (topic, crowd)
    # Eight conversations over four slots: a free slot is soon taken by another conversation
    # waiting in the queue, so later turns found their history in host memory.
    assert after.get("host", 0) > before.get("host", 0)


async def test_a_conversation_that_comes_back_to_its_slot_moves_nothing(node: Node) -> None:
    messages = [{"role": "user", "content": "Name a colour."}]
    async with aiohttp.ClientSession() as s:
        first = await chat(s, node.url, messages)
        messages += [
            {"role": "assistant", "content": first["choices"][0]["message"]["content"]},
            {"role": "user", "content": "And another one?"},
        ]
        async with s.post(
            f"{node.url}/generate",
            json={"prompt": "unused", "max_tokens": 1},
        ) as resp:
            assert resp.status == 200  # the node is idle again between the turns
        body = {"model": MODEL, "messages": messages, "max_tokens": 8, "temperature": 0.0}
        async with s.post(f"{node.url}/v1/chat/completions", json=body) as resp:
            second = await resp.json()
            request_id = resp.headers["X-Request-Id"]
        async with s.get(f"{node.url}/v1/requests/{request_id}") as resp:
            timeline = await resp.json()
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    assert (
        timeline["prefix_reused_tokens"]
        == second["usage"]["prompt_tokens_details"]["cached_tokens"]
    )
    assert "restore" not in timeline  # its slot kept it: nothing was copied


async def test_the_context_a_request_may_fill_is_one_slots_cells(node: Node) -> None:
    async with aiohttp.ClientSession() as s:
        async with s.get(node.url + "/v1/models") as resp:
            model = (await resp.json())["data"][0]
        assert (model["max_model_len"], model["gpu_layers"]) == (CTX_PER_SLOT, 0)
        # A prompt that fills every cell is refused; one that leaves 8 gets those 8, even
        # when it asks for 9 (clamped, and said so).
        body = {"model": model["id"], "prompt": [FILLER] * CTX_PER_SLOT, "max_tokens": 1}
        async with s.post(node.url + "/v1/completions", json=body) as resp:
            error = await resp.json()
            assert resp.status == 400, error
        assert f"context length is {CTX_PER_SLOT} tokens" in error["error"]["message"], error
        body.update(prompt=[FILLER] * (CTX_PER_SLOT - 8), max_tokens=9, ignore_eos=True)
        async with s.post(node.url + "/v1/completions", json=body) as resp:
            reply = await resp.json()
            assert resp.status == 200, reply
            assert resp.headers["X-TinyServe-Ignored"] == "max_tokens (clamped to 8)"
        usage = reply["usage"]
        assert (usage["prompt_tokens"], usage["completion_tokens"]) == (CTX_PER_SLOT - 8, 8)
