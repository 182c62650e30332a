"""Engine liveness through the board: loss ends in-flight work, a new engine is picked up."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

from aiohttp.test_utils import TestClient, TestServer

from tests.frontend.harness import FakeEngine, accepted, until, wait_serving
from tinyserve.config import Config, build_config
from tinyserve.frontend.http.app import build_app
from tinyserve.frontend.request.state import CLIENT, LINK
from tinyserve_native.board import Board

Client = TestClient[Any, Any]


def endless(submit: Any) -> list[list[dict[str, Any]]]:
    """Accept, then one token per tick for a long while."""
    return [[accepted()]] + [[{"token_ids": [1], "text": b"x"}] for _ in range(100_000)]


async def test_engine_appearing_later_is_picked_up(config: Config, client: Client) -> None:
    await asyncio.sleep(0.5)
    assert (await client.get("/ready")).status == 503
    engine = FakeEngine(config).start()
    try:
        await wait_serving(client)
        assert (await client.get("/ready")).status == 200
        assert (await client.post("/generate", json={"prompt": "Hi"})).status == 200
    finally:
        await engine.stop()


async def test_no_free_slot_is_retried(config: Config, client: Client) -> None:
    engine = FakeEngine(config, frontend_slots=1).start()
    try:
        taken = engine.board.claim_slot("someone-else", os.getpid(), time.monotonic_ns())
        await asyncio.sleep(0.6)
        assert (await client.get("/ready")).status == 503
        engine.board.release_slot(taken, os.getpid())
        await wait_serving(client)
        assert (await client.get("/ready")).status == 200
    finally:
        await engine.stop()


async def test_slot_is_claimed_and_published(served: Client, engine: FakeEngine) -> None:
    engine.script = lambda submit: []  # never answers: the request stays pending
    request = asyncio.create_task(served.post("/generate", json={"prompt": "Hi"}))
    try:
        await until(lambda: served.app[CLIENT].pending() == 1)
        await asyncio.sleep(0.3)  # at least one liveness tick
        assert engine.board.pending_requests() == served.app[CLIENT].pending()
    finally:
        request.cancel()


async def test_dead_engine_ends_requests_and_refuses_new_ones(
    served: Client, engine: FakeEngine
) -> None:
    engine.script = endless
    streaming = await served.post("/generate", json={"prompt": "Hi", "stream": True})
    assert streaming.status == 200
    waiting = asyncio.create_task(served.post("/generate", json={"prompt": "Hi"}))
    await until(lambda: len(engine.submits) == 2)
    engine.beating = False  # the engine hangs or dies: its heartbeat goes stale

    body = (await asyncio.wait_for(streaming.read(), 5)).decode()
    final = json.loads(body.strip().split("\n\n")[-1].removeprefix("data: "))
    assert final["finish_reason"] == "error"
    assert final["error"]["reason"] == "engine_unavailable"
    assert "usage" in final

    response = await asyncio.wait_for(waiting, 5)
    assert response.status == 503
    assert (await response.json())["error"]["reason"] == "engine_unavailable"
    assert "Retry-After" in response.headers

    assert (await served.get("/ready")).status == 503
    refused = await served.post("/generate", json={"prompt": "Hi"})
    assert refused.status == 503 and "Retry-After" in refused.headers
    assert (await served.get("/health")).status == 200


async def test_restarted_engine_is_served_without_restart(
    config: Config, served: Client, engine: FakeEngine
) -> None:
    engine.script = endless
    streaming = await served.post("/generate", json={"prompt": "Hi", "stream": True})
    await engine.stop()  # gone; the next engine replaces the board file
    successor = FakeEngine(config).start()
    try:
        body = (await asyncio.wait_for(streaming.read(), 5)).decode()
        assert '"finish_reason": "error"' in body.split("\n\n")[-2]
        await until(lambda: served.app[LINK].ack is not None, 5)
        assert served.app[LINK].ack.engine_started_ns == successor.started_ns  # type: ignore[union-attr]
        response = await served.post("/generate", json={"prompt": "Hi"})
        assert response.status == 200 and (await response.json())["text"] == "Hello"
        assert successor.submits and not engine.submits[1:]
    finally:
        await successor.stop()


async def test_slot_released_on_shutdown(config: Config, engine: FakeEngine) -> None:
    async with TestClient(TestServer(build_app(config))) as client:
        await wait_serving(client)
        assert len(_slots(engine.board)) == 1
    assert _slots(engine.board) == []


def _slots(board: Board) -> list[Any]:
    return list(board.frontend_slots())


async def test_a_slot_is_claimed_only_once_the_engine_acknowledged(config: Config) -> None:
    engine = FakeEngine(config)
    # Before the frontend starts: an engine that answered its first hello would end the
    # handshake before the test looked (a fresh clone's run saw that once).
    engine.acking = False
    engine.start()
    try:
        async with TestClient(TestServer(build_app(config))) as client:
            await until(lambda: len(engine.hellos) >= 2)  # the frontend is in its handshake
            assert _slots(engine.board) == []  # so no other frontend counts it as linked
            assert (await client.get("/ready")).status == 503
            engine.acking = True
            await wait_serving(client)
            [slot] = _slots(engine.board)
            assert slot.pid == os.getpid()
    finally:
        await engine.stop()


async def test_ready_waits_until_the_node_has_its_frontends_linked(tmp_path: Path) -> None:
    config = build_config({"runtime_dir": str(tmp_path), "ready_frontends": 3}, environ={})
    engine = FakeEngine(config).start()
    try:
        async with TestClient(TestServer(build_app(config))) as client:
            await wait_serving(client)
            assert await _ready(client) == (503, "1 of 3 frontends linked to the engine")
            # Another frontend of this process, and one that died without freeing its slot.
            other = engine.board.claim_slot("other", os.getpid(), time.monotonic_ns())
            engine.board.claim_slot("dead", _dead_pid(), time.monotonic_ns())
            assert await _ready(client) == (503, "2 of 3 frontends linked to the engine")
            engine.board.claim_slot("third", os.getpid(), time.monotonic_ns())
            assert await _ready(client) == (200, "")
            engine.board.release_slot(other, os.getpid())  # its link was lost
            assert await _ready(client) == (503, "2 of 3 frontends linked to the engine")
    finally:
        await engine.stop()


async def test_ready_is_not_200_for_an_engine_gone_since_the_last_tick(
    served: Client, engine: FakeEngine
) -> None:
    engine.board.set_identity(_dead_pid(), engine.started_ns)
    # /ready looks at the engine itself: the link would only notice at its next tick.
    assert (await _ready(served))[0] == 503


async def _ready(client: Client) -> tuple[int, str]:
    response = await client.get("/ready")
    body = await response.json()
    return response.status, body["error"]["message"] if response.status != 200 else ""


def _dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid
