"""A frontend's drain against the scripted stand-in engine: refuse new work at once, end the
streams still open at the drain timeout with an error event, cancel them in the engine."""

from __future__ import annotations

import json
from typing import Any

from aiohttp.test_utils import TestClient

from tests.frontend.harness import FakeEngine, accepted, until
from tinyserve import protocol
from tinyserve.frontend.http.drain import DRAIN, Drain, drain_app

Client = TestClient[Any, Any]


def never_ending(submit: protocol.Submit) -> list[list[dict[str, Any]]]:
    return [[accepted()], [{"token_ids": [1], "text": b"Hi"}]]


async def test_wait_idle_follows_requests_in_progress() -> None:
    drain = Drain()
    assert await drain.wait_idle(0)
    drain.enter()
    assert not await drain.wait_idle(0.01)
    drain.leave()
    assert await drain.wait_idle(0.01)


async def test_draining_refuses_new_requests_but_not_health(served: Client) -> None:
    served.app[DRAIN].begin()
    for method, path, body in [
        ("GET", "/ready", None),
        ("POST", "/generate", {"prompt": "x", "max_tokens": 2}),
    ]:
        async with served.request(method, path, json=body) as resp:
            assert resp.status == 503
            assert resp.headers["Retry-After"] == "1"
            assert (await resp.json())["error"]["reason"] == "draining"
    async with served.get("/health") as resp:
        assert resp.status == 200


async def test_stream_open_at_the_drain_timeout_ends_with_an_error(
    served: Client, engine: FakeEngine
) -> None:
    engine.script = never_ending
    resp = await served.post("/generate", json={"prompt": "x", "stream": True})
    assert resp.status == 200
    await until(lambda: served.app[DRAIN].in_progress == 1)
    await drain_app(served.app, 0.2)
    events = [json.loads(c[6:]) for c in (await resp.text()).split("\n\n") if c]
    assert events[0]["text"] == "Hi"
    assert events[-1]["finish_reason"] == "error" and "drain" in events[-1]["error"]["message"]
    await until(lambda: [c.request_id for c in engine.cancels] == [events[0]["id"]])
