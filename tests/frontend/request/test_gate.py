"""The gate against the scripted stand-in engine: one count of requests in progress; a drain
refuses new work at once, ends the streams still open at the drain timeout with an error
event and cancels them in the engine (the in-flight limit over HTTP: test_limits.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from tests.frontend.harness import FakeEngine, accepted, until
from tinyserve import protocol
from tinyserve.frontend.http.app import drain_app
from tinyserve.frontend.models.errors import ApiError
from tinyserve.frontend.request.gate import Gate
from tinyserve.frontend.request.state import GATE

Client = TestClient[Any, Any]


def never_ending(submit: protocol.Submit) -> list[list[dict[str, Any]]]:
    return [[accepted()], [{"token_ids": [1], "text": b"Hi"}]]


async def test_wait_idle_follows_requests_in_progress() -> None:
    gate = Gate()
    assert await gate.wait_idle(0)
    gate.enter()
    assert not await gate.wait_idle(0.01)
    gate.leave()
    assert await gate.wait_idle(0.01)


def test_the_limit_and_the_drain_decide_on_one_count() -> None:
    gate = Gate(limit=2)
    gate.enter()
    gate.enter()
    with pytest.raises(ApiError) as busy:
        gate.enter()
    assert busy.value.status == 429 and gate.in_progress == 2
    gate.leave()
    gate.enter()
    gate.begin_drain()
    with pytest.raises(ApiError) as draining:
        gate.enter()
    assert draining.value.status == 503 and draining.value.reason == "draining"
    assert gate.in_progress == 2


async def test_draining_refuses_new_requests_but_not_health(served: Client) -> None:
    served.app[GATE].begin_drain()
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
    await until(lambda: served.app[GATE].in_progress == 1)
    await drain_app(served.app, 0.2)
    events = [json.loads(c[6:]) for c in (await resp.text()).split("\n\n") if c]
    assert events[0]["text"] == "Hi"
    assert events[-1]["finish_reason"] == "error" and "drain" in events[-1]["error"]["message"]
    await until(lambda: [c.request_id for c in engine.cancels] == [events[0]["id"]])
