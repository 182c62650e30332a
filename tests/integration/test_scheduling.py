"""Admission, cancellation and timeouts across real frontends and a real engine."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator

import aiohttp
import pytest

from tinyserve_native.board import Board

from .node import Node, generate, sse_events

pytestmark = pytest.mark.integration

CTX_PER_SLOT = 256


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    running = Node(
        tmp_path_factory.mktemp("sched"),
        "--ctx-per-slot",
        str(CTX_PER_SLOT),
        "--slots",
        "4",
        "--chunk",
        "32",
        "--max-batch-tokens",
        "64",
        "--max-queue",
        "64",
    ).start()
    yield running
    assert running.stop() == 0


@pytest.fixture
def board(node: Node) -> Iterator[Board]:
    attached = Board.attach(str(node.runtime_dir / "board"))
    yield attached
    attached.close()


async def wait_idle(board: Board, timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        snap = board.snapshot()
        if snap.running == 0 and snap.waiting == 0 and snap.blocks_used == 0:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"engine not idle: {board.snapshot()}")


async def test_a_burst_of_long_requests_waits_for_slots(node: Node, board: Board) -> None:
    """Each slot has cells of its own: a burst of requests that each fill most of a slot is
    never refused or short of KV; four run at once, the others wait in the queue (64
    places), and every one is served."""
    prompt = "1, 2, 3, 4, 5,"
    async with aiohttp.ClientSession() as s:
        status, probe = await generate(s, node.url, prompt=prompt, max_tokens=1)
        assert status == 200
        await wait_idle(board)
        max_tokens = CTX_PER_SLOT - probe["usage"]["prompt_tokens"]
        peak_running = peak_waiting = 0

        async def watch() -> None:
            nonlocal peak_running, peak_waiting
            while True:
                snap = board.snapshot()
                assert snap.blocks_used <= snap.blocks_total
                peak_running = max(peak_running, snap.running)
                peak_waiting = max(peak_waiting, snap.waiting)
                await asyncio.sleep(0.005)

        async def one() -> tuple[int, dict[str, object]]:
            async with s.post(
                f"{node.url}/generate",
                json={"prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True},
            ) as resp:
                return resp.status, await resp.json()

        watcher = asyncio.create_task(watch())
        results = await asyncio.gather(*(one() for _ in range(6)))
        watcher.cancel()
    assert Counter(status for status, _ in results) == {200: 6}
    assert all(body["finish_reason"] == "length" for _, body in results)
    assert peak_running == 4 and peak_waiting >= 1
    await wait_idle(board)


async def test_queue_full_when_too_many_wait(tmp_path_factory: pytest.TempPathFactory) -> None:
    small = Node(
        tmp_path_factory.mktemp("queue"), "--slots", "1", "--max-queue", "2", frontends=1
    ).start()
    try:
        async with aiohttp.ClientSession() as s:
            results = await asyncio.gather(
                *(generate(s, small.url, prompt="Count to ten:", max_tokens=40) for _ in range(8))
            )
    finally:
        assert small.stop() == 0
    reasons = Counter(
        body["error"]["reason"] if status == 503 else status for status, body in results
    )
    assert reasons[200] == 3  # one running, two waiting
    assert reasons["queue_full"] == 5


async def test_disconnect_mid_decode_frees_the_slot_within_a_tick(node: Node, board: Board) -> None:
    async with aiohttp.ClientSession() as s:
        resp = await s.post(
            f"{node.url}/generate",
            # ignore_eos: the request must still be running when the client leaves
            json={
                "prompt": "1, 2, 3, 4, 5,",
                "max_tokens": 200,
                "stream": True,
                "ignore_eos": True,
            },
        )
        assert resp.status == 200, await resp.text()
        events = sse_events(resp)
        first = await anext(events)
        assert first["text"]
        assert board.snapshot().running == 1
        ticks_at_close = board.snapshot().ticks
        resp.close()
        await wait_idle(board)
    assert board.snapshot().ticks - ticks_at_close <= 2


async def test_disconnect_mid_prefill_frees_the_slot_within_a_tick(
    node: Node, board: Board
) -> None:
    prompt = "word " * 200  # 200 tokens: several ticks of 32-token chunks
    async with aiohttp.ClientSession() as s:
        task = asyncio.create_task(generate(s, node.url, prompt=prompt, max_tokens=50))
        while board.snapshot().running == 0:
            assert not task.done(), task.result()
            await asyncio.sleep(0.005)
        ticks_at_close = board.snapshot().ticks
        task.cancel()  # the client goes away before any token was generated
        with pytest.raises(asyncio.CancelledError):
            await task
        await wait_idle(board)
    assert board.snapshot().ticks - ticks_at_close <= 2


async def test_queue_and_request_timeouts(tmp_path_factory: pytest.TempPathFactory) -> None:
    timed = Node(
        tmp_path_factory.mktemp("timeouts"),
        "--slots",
        "1",
        "--queue-timeout",
        "0.5",
        "--request-timeout",
        "2",
        frontends=1,
    ).start()
    try:
        async with aiohttp.ClientSession() as s:
            long = asyncio.create_task(
                generate(s, timed.url, prompt="1, 2, 3, 4, 5,", max_tokens=1000, ignore_eos=True)
            )
            await asyncio.sleep(0.3)
            status, queued = await generate(s, timed.url, prompt="Hello", max_tokens=5)
            long_status, long_body = await long
    finally:
        assert timed.stop() == 0
    assert (status, queued["finish_reason"]) == (200, "queue_timeout")
    assert (long_status, long_body["finish_reason"]) == (200, "timeout")
    assert 0 < long_body["usage"]["completion_tokens"] < 1000
