"""``kill -9`` of the engine and of a frontend mid-stream, with real processes.

Killed processes are reaped at once, as systemd (their parent, PID 1) does.
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

ERROR_WITHIN_S = 1.0
# 3 of them fit the KV cache at once (4096 cells): 3 x 63 blocks of 16 tokens.
LONG = {"prompt": "1, 2, 3, 4, 5,", "max_tokens": 1000, "ignore_eos": True}


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UnitNode]:
    running = UnitNode(tmp_path_factory.mktemp("recovery"), 2, engine_flags=("--slots", "4"))
    try:
        yield running.start()
    finally:
        running.stop()


async def timed_json(session: aiohttp.ClientSession, url: str) -> tuple[float, Any]:
    reply = await post_json(session, url, **LONG)
    return time.monotonic(), reply


async def test_engine_kill9_fails_in_flight_fast_and_frontends_reconnect(
    node: UnitNode, capsys: pytest.CaptureFixture[str]
) -> None:
    await until(lambda: node.snapshot().running == 0, 30, "an idle engine")
    streams = [TimedStream(), TimedStream()]
    async with aiohttp.ClientSession() as session:
        in_flight = asyncio.gather(
            *(
                timed_stream(session, url, LONG, s)
                for url, s in zip(node.urls, streams, strict=True)
            ),
            timed_json(session, node.urls[0]),
        )
        await until(lambda: all(s.events for s in streams), 60, "streams to start")
        await until(lambda: node.snapshot().running == 3, 10, "three running requests")
        killed = node.engine.kill9()
        *_, (json_at, json_reply) = await asyncio.wait_for(in_flight, 10)

        # Every in-flight request ended with an error, within a second, none silently.
        for stream in streams:
            assert stream.final is not None, "stream closed without a final event"
            assert stream.final["finish_reason"] == "error"
            assert stream.final["error"]["reason"] == "engine_unavailable"
        status, headers, body = json_reply
        assert status == 503 and body["error"]["reason"] == "engine_unavailable"
        assert "Retry-After" in headers
        delays = [s.ended_at - killed for s in streams] + [json_at - killed]
        assert max(delays) < ERROR_WITHIN_S, delays

        # New requests: 503 engine_unavailable with a Retry-After; not ready.
        for url in node.urls:
            status, headers, body = await post_json(session, url, prompt="Hi", max_tokens=2)
            assert status == 503 and body["error"]["reason"] == "engine_unavailable"
            assert int(headers["Retry-After"]) >= 1
            assert (await get_json(session, url + "/ready"))[0] == 503

        # A new engine (what Restart=on-failure does): the same frontends serve again.
        pids = [front.pid for front in node.fronts]
        restarted = time.monotonic()
        node.engine.start().wait_for("READY=1")
        engine_ready = time.monotonic()
        for url in node.urls:
            status, _, body = await post_json(session, url, prompt="Hi", max_tokens=2)
            while status == 503 and time.monotonic() - engine_ready < 10:
                await asyncio.sleep(0.05)
                status, _, body = await post_json(session, url, prompt="Hi", max_tokens=2)
            assert status == 200, body
        serving = time.monotonic()
    assert [front.pid for front in node.fronts] == pids
    assert all(front.process is not None and front.process.poll() is None for front in node.fronts)
    with capsys.disabled():
        print(
            f"\nengine kill -9: in-flight errors after {[round(d, 3) for d in delays]} s; "
            f"engine restart {engine_ready - restarted:.2f} s, frontends serving "
            f"{serving - engine_ready:.2f} s after its READY=1"
        )


async def test_frontend_kill9_engine_reclaims_its_work(
    node: UnitNode, capsys: pytest.CaptureFixture[str]
) -> None:
    await until(lambda: node.snapshot().running == 0, 30, "an idle engine")
    idle = node.snapshot()
    victim = node.fronts[0]
    streams = [TimedStream(), TimedStream()]
    async with aiohttp.ClientSession() as session:
        in_flight = asyncio.gather(
            *(timed_stream(session, node.urls[0], LONG, s) for s in streams),
            return_exceptions=True,
        )
        await until(lambda: all(s.events for s in streams), 60, "streams to start")
        busy = node.snapshot()
        assert busy.running == 2 and busy.blocks_used > idle.blocks_used
        assert victim.pid in {slot.pid for slot in node.frontend_slots()}
        killed = victim.kill9()

        def reclaimed() -> bool:
            now = node.snapshot()
            slots = {slot.pid for slot in node.frontend_slots()}
            return (
                now.running == 0 and now.blocks_used == idle.blocks_used and victim.pid not in slots
            )

        done = await until(reclaimed, 10, "the engine to reclaim the dead frontend's work")
        await in_flight  # the clients saw their connection drop
        status, _, body = await post_json(session, node.urls[1], prompt="Hi", max_tokens=2)
    assert status == 200, body
    assert done - killed < 3.0
    assert "frontend gone" in node.engine.log()
    with capsys.disabled():
        print(f"\nfrontend kill -9: engine reclaimed its work after {done - killed:.2f} s")
