"""Streams that show progress, on every surface: keep-alive data while a stream has nothing
to say (a long prefill before the first token), and prefill progress events when a request
asks for them (``return_progress``, from the engine's ``RequestUpdate.prompt_done``)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from tests.frontend.harness import FakeEngine, Tick, accepted, wait_serving
from tinyserve import protocol
from tinyserve.config import Config
from tinyserve.frontend.http.app import build_app

Client = TestClient[Any, Any]
PROMPT = {"messages": [{"role": "user", "content": "Hi"}]}
# Each surface's streaming request, and the first line of what it sends to keep alive.
SURFACES = {
    "/generate": ({"prompt": "Hi"}, ": keep-alive"),
    "/v1/completions": ({"model": "fake", "prompt": "Hi"}, ": keep-alive"),
    "/v1/chat/completions": ({"model": "fake", **PROMPT}, ": keep-alive"),
    "/v1/responses": ({"model": "fake", "input": "Hi"}, ": keep-alive"),
    "/v1/messages": ({"model": "fake", "max_tokens": 8, **PROMPT}, "event: ping"),
}


def slow_prefill(submit: protocol.Submit) -> list[Tick]:
    """Accepted, two quiet ticks (a prefill going on), then a token and the end; with
    progress reports on those ticks (8 tokens came from the prefix cache)."""
    total = len(submit.prompt_ids)
    return [
        [accepted()],
        [{"prompt_done": min(16, total), "cached_tokens": 8}],
        [{"prompt_done": total, "cached_tokens": 8}],
        [{"token_ids": [1], "text": b"Hi", "finish_reason": protocol.FINISH_STOP,
          "prompt_tokens": total, "cached_tokens": 8}],
    ]  # fmt: skip


@pytest.fixture
async def pinging(config: Config) -> AsyncIterator[tuple[Client, FakeEngine]]:
    """A frontend that sends keep-alives after 50 ms of quiet, and an engine whose ticks take
    200 ms."""
    engine = FakeEngine(config, tick_s=0.2).start()
    engine.script = slow_prefill
    app = build_app(dataclasses.replace(config, sse_ping_interval=0.05))
    async with TestClient(TestServer(app)) as client:
        await wait_serving(client)
        yield client, engine
    await engine.stop()


def events(body: bytes) -> list[str]:
    """The events of an SSE body, as their text."""
    raw = body.decode().split("\n\n")
    assert raw[-1] == ""
    return raw[:-1]


def first_text_at(stream: list[str]) -> int:
    """Where the first event that carries the token's text is."""
    return next(i for i, e in enumerate(stream) if '"Hi"' in e)


@pytest.mark.parametrize("path", SURFACES)
async def test_a_quiet_stream_is_kept_alive_before_its_first_token(
    pinging: tuple[Client, FakeEngine], path: str
) -> None:
    client, _ = pinging
    body, keepalive = SURFACES[path]
    response = await client.post(path, json={**body, "stream": True})
    assert response.status == 200
    stream = events(await response.read())
    kept = [i for i, e in enumerate(stream) if e.startswith(keepalive)]
    assert kept and kept[0] < first_text_at(stream), stream
    assert not any("prompt_progress" in e for e in stream)  # not asked for


async def test_no_keepalive_when_turned_off(engine: FakeEngine, config: Config) -> None:
    engine.tick_s, engine.script = 0.1, slow_prefill
    app = build_app(dataclasses.replace(config, sse_ping_interval=0))
    async with TestClient(TestServer(app)) as client:
        await wait_serving(client)
        response = await client.post("/generate", json={"prompt": "Hi", "stream": True})
        stream = events(await response.read())
    assert [json.loads(e.removeprefix("data: "))["text"] for e in stream] == ["Hi", ""]


def progress_of(event: str) -> dict[str, Any] | None:
    """The prefill progress an event reports, if it is one."""
    payload = event.split("data: ", 1)[1]
    if payload == "[DONE]":
        return None
    data = json.loads(payload)
    progress: dict[str, Any] | None = data.get("prompt_progress")
    if progress is not None:
        assert set(data) <= {"id", "object", "created", "model", "choices", "prompt_progress",
                             "type", "sequence_number"}, data  # fmt: skip
        assert data.get("choices", []) == []  # a chunk of no choice
    return progress


@pytest.mark.parametrize("path", SURFACES)
async def test_prefill_progress_is_reported_when_asked(
    served: Client, engine: FakeEngine, path: str
) -> None:
    engine.script = slow_prefill
    body, keepalive = SURFACES[path]
    response = await served.post(path, json={**body, "stream": True, "return_progress": True})
    assert response.status == 200, await response.text()
    stream = [e for e in events(await response.read()) if not e.startswith(keepalive)]
    reports = [(i, p) for i, e in enumerate(stream) if (p := progress_of(e)) is not None]
    total = len(engine.submits[0].prompt_ids)
    assert [(p["total"], p["cache"], p["processed"]) for _, p in reports] == [
        (total, 8, min(16, total)), (total, 8, total)]  # fmt: skip
    assert reports[-1][0] < first_text_at(stream)
    assert reports[0][1]["time_ms"] <= reports[1][1]["time_ms"]
