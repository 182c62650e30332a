"""Per-request timelines from a real node (engine + two frontends as processes)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from tinyserve_native.board import Board

from .node import Node, sse_events

pytestmark = pytest.mark.integration

CHUNK = 16
ROUNDING_MS = 0.01
# Besides the engine's ticks, the client's clock also covers the HTTP request and response
# and the hop from the engine's PUB socket to the frontend: allowed on top of one tick.
# Measured at 20 ms at most here; 250 leaves room for a loaded CI machine and is still far
# below the queue wait behind 64 generated tokens (about 1 s), which a timeline that lost
# the wait would miss by.
HOPS_MS = 250.0


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    flags = (
        "--slots",
        "1",
        "--chunk",
        str(CHUNK),
        "--ctx-per-slot",
        "1024",
        "--policy",
        "fifo",
        "--no-prefix-cache",
    )
    running = Node(tmp_path_factory.mktemp("timeline"), *flags, frontends=2).start()
    yield running
    assert running.stop() == 0


async def timed_stream(
    session: aiohttp.ClientSession, url: str, **body: Any
) -> tuple[dict[str, Any], float, float, str]:
    """Stream a request: (final event, client TTFT ms, client total ms, serving frontend)."""
    started = time.monotonic()
    first = 0.0
    async with session.post(f"{url}/generate", json={**body, "stream": True}) as resp:
        assert resp.status == 200, await resp.text()
        async for event in sse_events(resp):
            if event.get("text") and not first:
                first = time.monotonic()
            if "finish_reason" in event:
                final = event
        total = time.monotonic()
        return (
            final,
            (first - started) * 1e3,
            (total - started) * 1e3,
            resp.headers["X-TinyServe-Frontend"],
        )


async def board_shows(node: Node, running: int, waiting: int) -> None:
    """Until the engine's board shows these counts (the order requests reached it)."""
    board = Board.attach(str(node.runtime_dir / "board"))
    try:
        for _ in range(1000):
            snap = board.snapshot()
            if (snap.running, snap.waiting) == (running, waiting):
                return
            await asyncio.sleep(0.005)
    finally:
        board.close()
    raise AssertionError(f"board never showed running={running} waiting={waiting}")


async def get_from_other_frontend(url: str, path: str, not_pid: str) -> aiohttp.ClientResponse:
    """GET ``path`` on a fresh connection until a frontend other than ``not_pid`` answers."""
    for _ in range(50):
        connector = aiohttp.TCPConnector(force_close=True)
        async with aiohttp.ClientSession(connector=connector) as s, s.get(f"{url}{path}") as resp:
            await resp.read()
            if resp.headers["X-TinyServe-Frontend"] != not_pid:
                return resp
    raise AssertionError("the other frontend never answered")


async def test_timeline_of_a_request_that_waited_adds_up_to_what_the_client_measured(
    node: Node,
) -> None:
    async with aiohttp.ClientSession() as session:
        ahead = asyncio.create_task(
            timed_stream(session, node.url, prompt="1, 2, 3, 4, 5,", max_tokens=64, ignore_eos=True)
        )
        await board_shows(node, running=1, waiting=0)  # it holds the only slot
        between = asyncio.create_task(
            timed_stream(session, node.url, prompt="a b c", max_tokens=4, ignore_eos=True)
        )
        await board_shows(node, running=1, waiting=1)  # it waits too, and will go first
        final, ttft_ms, total_ms, pid = await timed_stream(
            session,
            node.url,
            prompt="Tell me a story about a cat and a dog and a bird.",
            max_tokens=8,
            ignore_eos=True,
            timeline=True,
        )
        await ahead
        await between
    t = final["timeline"]
    assert t["status"] == "finished" and t["request_id"] == final["id"]
    assert t["admission"]["decision"] == "admitted"
    # When it came, one request ran and one waited; that one was admitted ahead of it.
    assert (t["accepted"]["running"], t["accepted"]["waiting"]) == (1, 1)
    assert t["queue"]["ahead"] == 1 and t["queue"]["rule"] == "arrival"
    assert t["queue"]["wait_ms"] > 0
    prompt = final["usage"]["prompt_tokens"]
    assert sum(c["tokens"] for c in t["prefill"]) == prompt
    assert all(c["tokens"] <= CHUNK for c in t["prefill"])
    assert t["decode"]["ticks"] == final["usage"]["completion_tokens"] - 1
    # The timeline adds up by itself...
    assert t["accepted"]["ms"] + t["queue"]["wait_ms"] == pytest.approx(
        t["slot"]["ms"], abs=ROUNDING_MS
    )
    assert t["slot"]["ms"] + sum(c["ms"] for c in t["prefill"]) == pytest.approx(
        t["first_token_ms"], abs=ROUNDING_MS
    )
    tick_ms = max([c["ms"] for c in t["prefill"]] + [ms / n for _, n, _, ms in t["decode"]["runs"]])
    end_of_decode = t["first_token_ms"] + t["decode"]["ms"]
    assert 0 <= t["finish"]["ms"] - end_of_decode <= tick_ms
    # ...and to the latencies the client measured, within a tick (plus the HTTP/ZMQ hops).
    print(
        f"ttft client {ttft_ms:.1f} timeline {t['first_token_ms']:.1f}; "
        f"total client {total_ms:.1f} timeline {t['finish']['ms']:.1f}; tick {tick_ms:.1f}"
    )
    assert 0 <= ttft_ms - t["first_token_ms"] <= tick_ms + HOPS_MS
    assert 0 <= total_ms - t["finish"]["ms"] <= tick_ms + HOPS_MS

    # Any frontend answers for any request: the timeline lives in the engine.
    resp = await get_from_other_frontend(node.url, f"/v1/requests/{final['id']}", pid)
    assert resp.status == 200
    assert await resp.json() == t


async def test_unknown_request_id_is_404(node: Node) -> None:
    url = f"{node.url}/v1/requests/no-such-request"
    async with aiohttp.ClientSession() as session, session.get(url) as resp:
        assert resp.status == 404
        error = (await resp.json())["error"]
        assert error["code"] == "not_found" and "no-such-request" in error["message"]


async def test_an_openai_reply_id_finds_its_timeline(node: Node) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{node.url}/v1/models") as resp:
            model = (await resp.json())["data"][0]["id"]
        body = {"model": model, "prompt": "Hello", "max_tokens": 2}
        async with session.post(f"{node.url}/v1/completions", json=body) as resp:
            assert resp.status == 200
            reply_id = (await resp.json())["id"]
        assert reply_id.startswith("cmpl-")
        async with session.get(f"{node.url}/v1/requests/{reply_id}") as resp:
            assert resp.status == 200
            timeline = await resp.json()
    assert timeline["request_id"] == reply_id.removeprefix("cmpl-")
    assert timeline["finish"]["generated_tokens"] <= 2
