"""A real node (launcher, engine, two frontends) on the real default model."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from tinyserve_native.board import Board

from .node import Node, generate, stream

pytestmark = pytest.mark.integration

HYPHEN = "\uff0d"


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    running = Node(tmp_path_factory.mktemp("node"), "--slots", "8").start()
    yield running
    assert running.stop() == 0


async def test_health_and_ready(node: Node) -> None:
    async with aiohttp.ClientSession() as s:
        for path in ("/health", "/ready"):
            async with s.get(node.url + path) as resp:
                assert resp.status == 200, await resp.text()


async def test_json_and_sse_agree_for_a_greedy_request(node: Node) -> None:
    body = {"prompt": "The capital of France is", "max_tokens": 24}
    async with aiohttp.ClientSession() as s:
        status, reply = await generate(s, node.url, **body)
        events = await stream(s, node.url, **body)
    assert status == 200, reply
    assert reply["finish_reason"] in {"stop", "length"}
    final = events[-1]
    assert [e for e in events if "finish_reason" in e] == [final]
    assert "".join(e.get("text", "") for e in events) == reply["text"]
    assert final["finish_reason"] == reply["finish_reason"]
    # The same counts, but the stream came second: it may reuse the start of the block the
    # first one left cached (its prompt is shorter than a block), never less than the first.
    cached = final["usage"].pop("cached_tokens")
    assert cached >= reply["usage"].pop("cached_tokens")
    assert final["usage"] == reply["usage"]


async def test_exact_max_tokens(node: Node) -> None:
    async with aiohttp.ClientSession() as s:
        # Numbers keep the model talking: no end-of-generation token within 40 tokens.
        status, reply = await generate(s, node.url, prompt="1, 2, 3, 4, 5,", max_tokens=40)
    assert status == 200
    assert (reply["finish_reason"], reply["usage"]["completion_tokens"]) == ("length", 40)


async def test_stop_string_is_cut(node: Node) -> None:
    body = {"prompt": "1, 2, 3, 4, 5,", "max_tokens": 30}
    async with aiohttp.ClientSession() as s:
        _, free = await generate(s, node.url, **body)
        assert " 8" in free["text"], free
        _, stopped = await generate(s, node.url, **body, stop=[" 8"])
        events = await stream(s, node.url, **body, stop=[" 8"])
    assert stopped["finish_reason"] == "stop"
    assert stopped["text"] == free["text"][: free["text"].index(" 8")]
    assert "".join(e.get("text", "") for e in events) == stopped["text"]


async def test_character_split_across_tokens_streams_whole(node: Node) -> None:
    # Measured with SmolLM2: asked to repeat it, the model emits U+FF0D (fullwidth hyphen),
    # whose three UTF-8 bytes are two tokens; the frontend must never show half of it.
    body = {"prompt": "Repeat after me: " + HYPHEN * 6, "max_tokens": 12}
    async with aiohttp.ClientSession() as s:
        events = await stream(s, node.url, **body)
    text = "".join(e.get("text", "") for e in events)
    assert "\ufffd" not in text
    assert HYPHEN in text


async def test_eight_concurrent_requests_share_the_engine(node: Node) -> None:
    board = Board.attach(str(node.runtime_dir / "board"))
    peak = 0

    async def watch() -> None:
        nonlocal peak
        while True:
            peak = max(peak, board.snapshot().running)
            await asyncio.sleep(0.01)

    async with aiohttp.ClientSession() as s:
        watcher = asyncio.create_task(watch())
        replies = await asyncio.gather(
            *(generate(s, node.url, prompt=f"Count from {i}:", max_tokens=32) for i in range(8))
        )
        watcher.cancel()
    board.close()
    assert all(status == 200 for status, _ in replies), replies
    assert all(r["usage"]["completion_tokens"] > 0 for _, r in replies)
    assert peak == 8  # all eight held a slot at once, so each tick decoded them together


async def test_both_frontends_serve(node: Node) -> None:
    pids = set()
    async with aiohttp.ClientSession() as s:
        for _ in range(40):
            # A fresh connection each time: SO_REUSEPORT spreads connections, not requests.
            async with aiohttp.ClientSession() as fresh, fresh.get(node.url + "/health") as r:
                pids.add(r.headers["X-TinyServe-Frontend"])
            if len(pids) == 2:
                break
        status, _ = await generate(s, node.url, prompt="Hi", max_tokens=2)
    assert status == 200
    assert len(pids) == 2


BAD_INPUTS = [
    (b"{not json", 400),
    (b"[1, 2]", 400),
    (json.dumps({}).encode(), 400),
    (json.dumps({"prompt": ""}).encode(), 400),
    (json.dumps({"prompt": 5}).encode(), 400),
    (json.dumps({"prompt": "x", "max_tokens": 0}).encode(), 400),
    (json.dumps({"prompt": "x", "max_tokens": "5"}).encode(), 400),
    (json.dumps({"prompt": "x", "max_tokens": True}).encode(), 400),
    (json.dumps({"prompt": "x", "temperature": -1}).encode(), 400),
    (json.dumps({"prompt": "x", "stream": "yes"}).encode(), 400),
    (json.dumps({"prompt": "x", "stop": [1]}).encode(), 400),
    (json.dumps({"prompt": "x", "bogus_field": 1, "max_tokens": 0}).encode(), 400),
    (json.dumps({"prompt": "word " * 1500, "max_tokens": 1000}).encode(), 400),
]


@pytest.mark.parametrize(("body", "status"), BAD_INPUTS)
async def test_bad_input_gets_a_json_4xx(node: Node, body: bytes, status: int) -> None:
    async with aiohttp.ClientSession() as s:
        async with s.post(
            node.url + "/generate", data=body, headers={"Content-Type": "application/json"}
        ) as resp:
            assert resp.status == status
            error = (await resp.json())["error"]
            assert error["type"] and error["message"]
        async with s.get(node.url + "/health") as resp:
            assert resp.status == 200


async def test_unknown_route_is_a_json_404(node: Node) -> None:
    async with aiohttp.ClientSession() as s, s.get(node.url + "/nope") as resp:
        assert resp.status == 404
        assert (await resp.json())["error"]["type"]


def test_runtime_dir_is_private(node: Node) -> None:
    assert (Path(node.runtime_dir).stat().st_mode & 0o777) == 0o700
