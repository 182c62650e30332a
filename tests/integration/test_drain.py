"""Graceful drain with real processes: SIGTERM to a frontend, then to the engine.

Requests in flight when the signal arrives finish whole (none is lost); only one that outlasts
the drain timeout is cut, and it ends with an error event, never a silent close. Token counts
are small and timeouts generous: the shared 2-core test machine can be slow.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from tests.integration.units import (
    TimedStream,
    UnitNode,
    get_json,
    post_json,
    timed_stream,
    until,
)

pytestmark = pytest.mark.integration

PROMPT = "1, 2, 3, 4, 5,"
# ignore_eos: only max_tokens ends these, however the model continues
SHORT = {"prompt": PROMPT, "max_tokens": 8, "ignore_eos": True}
LONG = {
    "prompt": PROMPT,
    "max_tokens": 3000,
    "ignore_eos": True,
}  # minutes on this CPU: outlasts any drain here
FRONTEND_CUT_S = 2.0
ENGINE_DRAIN_S = 10.0
AT_ONCE_S = 2.0


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UnitNode]:
    # Frontend 0 drains patiently, frontend 1 cuts after 2 s, frontend 2 stays for the engine.
    running = UnitNode(
        tmp_path_factory.mktemp("drain"),
        3,
        engine_flags=("--slots", "4", "--drain-timeout", str(ENGINE_DRAIN_S)),
        each_frontend=(("--drain-timeout", "60"), ("--drain-timeout", str(FRONTEND_CUT_S))),
    )
    try:
        yield running.start()
    finally:
        running.stop()


async def streams_started(
    session: aiohttp.ClientSession, url: str, *bodies: dict[str, Any]
) -> tuple[list[TimedStream], asyncio.Future[list[TimedStream]]]:
    """Streams of ``bodies`` on ``url``, each past its first event."""
    seen = [TimedStream() for _ in bodies]
    done = asyncio.gather(
        *(timed_stream(session, url, b, s) for b, s in zip(bodies, seen, strict=True))
    )
    await until(lambda: all(s.events for s in seen), 60, "the streams to start")
    return seen, done


def assert_whole(stream: TimedStream) -> None:
    assert stream.final is not None and stream.final["finish_reason"] == "length", stream.events
    assert stream.final["usage"]["completion_tokens"] == SHORT["max_tokens"]


def assert_cut_with_error(stream: TimedStream, after_s: float, signalled: float) -> None:
    assert stream.final is not None, "stream closed without a final event"
    assert stream.final["finish_reason"] == "error" and stream.final["error"]["message"]
    assert after_s - 0.5 < stream.ended_at - signalled < after_s + 5


async def test_sigterm_to_a_frontend_finishes_its_streams_then_exits(node: UnitNode) -> None:
    front, url = node.fronts[0], node.urls[0]
    async with aiohttp.ClientSession() as session:
        streams, done = await streams_started(session, url, SHORT, SHORT)
        front.terminate()
        signalled = time.monotonic()
        async with aiohttp.ClientSession() as fresh:
            ready = await get_json(fresh, url + "/ready")
            not_ready_after = time.monotonic() - signalled
            refused = await post_json(fresh, url, prompt="Hi", max_tokens=2)
            health = await get_json(fresh, url + "/health")
            other = await get_json(fresh, node.urls[2] + "/ready")
        await done
    assert front.wait(30) == 0
    exited_after_last_stream = time.monotonic() - max(s.ended_at for s in streams)
    # At once: not ready, new work refused with a Retry-After; still alive; the node serves.
    assert not_ready_after < AT_ONCE_S
    assert ready[0] == 503 and ready[2]["error"]["reason"] == "draining"
    assert refused[0] == 503 and refused[2]["error"]["reason"] == "draining"
    assert refused[1]["Retry-After"] == "1"
    assert health[0] == 200 and other[0] == 200
    # Nothing in flight lost, and no waiting for the 60 s drain timeout once they were done.
    for stream in streams:
        assert_whole(stream)
    assert exited_after_last_stream < 5
    assert "STOPPING=1" in front.messages + front.poll_messages()


async def test_frontend_drain_timeout_ends_a_stream_with_an_error(node: UnitNode) -> None:
    front, url = node.fronts[1], node.urls[1]
    async with aiohttp.ClientSession() as session:
        (stream,), done = await streams_started(session, url, LONG)
        front.terminate()
        signalled = time.monotonic()
        await done
    assert_cut_with_error(stream, FRONTEND_CUT_S, signalled)
    assert front.wait(30) == 0
    # Cut here means cancelled in the engine too, not left generating for nobody.
    await until(lambda: node.snapshot().running == 0, 10, "the engine to cancel it")


async def test_sigterm_to_the_engine_drains_it(node: UnitNode) -> None:
    url = node.urls[2]
    async with aiohttp.ClientSession() as session:
        (short, long), done = await streams_started(session, url, SHORT, LONG)
        node.engine.terminate()
        signalled = time.monotonic()
        async with aiohttp.ClientSession() as fresh:
            # The frontends read "draining" on the board that the engine updates every tick.
            ready = await get_json(fresh, url + "/ready")
            while ready[0] == 200 and time.monotonic() - signalled < AT_ONCE_S:
                await asyncio.sleep(0.02)
                ready = await get_json(fresh, url + "/ready")
            refused = await post_json(fresh, url, prompt="Hi", max_tokens=2)
        await done
        assert node.engine.wait(30) == 0
        stopped_after = time.monotonic() - signalled
        async with aiohttp.ClientSession() as fresh:
            gone = await get_json(fresh, url + "/ready")
            while gone[2]["error"]["reason"] == "draining" and time.monotonic() - signalled < 30:
                await asyncio.sleep(0.05)
                gone = await get_json(fresh, url + "/ready")
    assert ready[0] == 503 and ready[2]["error"]["reason"] == "draining"
    assert refused[0] == 503 and refused[2]["error"]["reason"] == "draining"
    assert int(refused[1]["Retry-After"]) >= 1
    assert_whole(short)
    assert_cut_with_error(long, ENGINE_DRAIN_S, signalled)
    assert stopped_after < ENGINE_DRAIN_S + 5
    node.engine.poll_messages()
    assert "STOPPING=1" in node.engine.messages
    assert "WATCHDOG=1" not in node.engine.messages  # no WATCHDOG_USEC, no pings
    assert gone[0] == 503 and gone[2]["error"]["reason"] == "engine_unavailable"
