"""The frontend's finished-request log line and the timeline route, against the stand-in engine."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestClient

from tests.frontend.harness import MAX_QUEUE, FakeEngine, Tick, accepted, until
from tinyserve import protocol
from tinyserve.frontend.native import request_timeline
from tinyserve.logs import JsonFormatter

Client = TestClient[Any, Any]
TIMELINE = {"request_id": "x", "status": "finished", "slot": {"ms": 12.5}}
# The ``request finished`` line's fields (docs/observability.md).
LOG_FIELDS = (
    "request_id", "route", "tenant", "priority", "status", "finish_reason", "error",
    "prompt_tokens", "cached_tokens", "generated_tokens", "queue_ms", "ttft_ms", "total_ms",
)  # fmt: skip


def timed_script(submit: protocol.Submit) -> list[Tick]:
    """Accept, two tokens, finish with a timeline, as the real engine always sends one."""
    return [
        [accepted()],
        [{"token_ids": [1, 2], "text": b"Hi"}],
        [
            {
                "token_ids": [3],
                "text": b"!",
                "finish_reason": protocol.FINISH_LENGTH,
                "prompt_tokens": len(submit.prompt_ids),
                "cached_tokens": 4,
                "timeline": TIMELINE,
            }
        ],
    ]


def request_lines(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    formatter = JsonFormatter("frontend")
    return [
        json.loads(formatter.format(r))
        for r in caplog.records
        if r.name == "tinyserve.requests" and r.getMessage() == "request finished"
    ]


async def test_finished_request_writes_one_json_line_with_every_field(
    served: Client, engine: FakeEngine, caplog: pytest.LogCaptureFixture
) -> None:
    engine.script = timed_script
    caplog.set_level(logging.INFO, logger="tinyserve.requests")
    body = {"prompt": "hello there", "max_tokens": 3, "tenant": "team-a", "priority": 2}
    response = await served.post("/generate", json=body)
    assert response.status == 200
    reply = await response.json()
    (line,) = request_lines(caplog)
    assert set(LOG_FIELDS) <= set(line)
    submit = engine.submits[-1]
    assert line["request_id"] == reply["id"] == submit.request_id
    assert (line["tenant"], line["priority"], line["route"]) == ("team-a", 2, "/generate")
    assert (line["status"], line["finish_reason"], line["error"]) == (200, "length", None)
    assert line["prompt_tokens"] == len(submit.prompt_ids)
    assert (line["cached_tokens"], line["generated_tokens"]) == (4, 3)
    assert line["queue_ms"] == 12.5  # the engine's timeline: arrival to slot grant
    assert 0 < line["ttft_ms"] <= line["total_ms"]
    assert line["level"] == "info" and line["process"] == "frontend"


async def test_rejected_request_is_logged_with_its_status_and_reason(
    served: Client, engine: FakeEngine, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="tinyserve.requests")
    engine.publish_load(waiting=MAX_QUEUE + 4, running=4)
    response = await served.post("/generate", json={"prompt": "hi"})
    assert response.status == 503
    (line,) = request_lines(caplog)
    assert (line["status"], line["error"], line["finish_reason"]) == (503, "queue_full", "rejected")
    assert line["generated_tokens"] == 0 and line["ttft_ms"] is None
    # The rejection names the request its log line (and its metrics) count.
    assert response.headers["X-Request-Id"] == line["request_id"]


async def test_a_client_that_leaves_mid_stream_is_logged_as_cancelled_with_the_200_sent(
    served: Client, engine: FakeEngine, caplog: pytest.LogCaptureFixture
) -> None:
    def slow(_submit: protocol.Submit) -> list[Tick]:
        return [[accepted()]] + [[{"token_ids": [1], "text": b"x"}] for _ in range(500)]

    caplog.set_level(logging.INFO, logger="tinyserve.requests")
    engine.tick_s, engine.script = 0.02, slow
    body = {"prompt": "hi", "max_tokens": 200, "stream": True}
    response = await served.post("/generate", json=body)
    assert (await response.content.readuntil(b"\n\n")).startswith(b"data: ")
    response.close()
    await until(lambda: bool(request_lines(caplog)))
    (line,) = request_lines(caplog)
    # The stream's headers had gone out: its status was 200, however it ended.
    assert (line["status"], line["error"], line["finish_reason"]) == (
        200,
        "client_closed",
        "cancelled",
    )
    assert line["generated_tokens"] >= 1


async def test_a_client_that_leaves_before_any_reply_is_logged_as_499(
    served: Client, engine: FakeEngine, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="tinyserve.requests")
    engine.script = lambda _submit: []  # never accepted: no reply starts
    body = {"prompt": "hi", "max_tokens": 8, "stream": True}
    with contextlib.suppress(asyncio.TimeoutError):
        await served.post("/generate", json=body, timeout=aiohttp.ClientTimeout(total=0.3))
    await until(lambda: bool(request_lines(caplog)))
    (line,) = request_lines(caplog)
    assert (line["status"], line["error"], line["finish_reason"]) == (
        499,
        "client_closed",
        "cancelled",
    )


async def test_admission_figures_travel_in_the_submit(served: Client, engine: FakeEngine) -> None:
    engine.publish_load(waiting=1, running=2)
    assert (await served.post("/generate", json={"prompt": "hi", "max_tokens": 4})).status == 200
    admission = engine.submits[-1].admission
    assert admission["decision"] == "admitted"
    assert (admission["waiting"], admission["running"], admission["slots"]) == (1, 2, 4)
    assert admission["n_ctx"] > 0 and admission["ms"] >= 0


async def test_timeline_query_the_engine_does_not_answer_is_503(
    served: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The stand-in engine ignores TimelineQuery: the frontend must not wait forever.
    monkeypatch.setattr(request_timeline, "QUERY_TIMEOUT_S", 0.2)
    response = await served.get("/v1/requests/abc")
    assert response.status == 503
    error = (await response.json())["error"]
    assert error["code"] == "engine_unavailable"
