"""The HTTP API end to end through the frontend, against the scripted stand-in engine."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp.test_utils import TestClient

from tests.frontend.harness import MAX_QUEUE, FakeEngine, accepted, until
from tinyserve import protocol
from tinyserve.frontend.request.state import CLIENT

Client = TestClient[Any, Any]


async def sse_events(response: Any) -> list[dict[str, Any]]:
    body = (await response.read()).decode()
    assert body.endswith("\n\n")
    chunks = body.split("\n\n")[:-1]
    assert all(chunk.startswith("data: ") for chunk in chunks)
    return [json.loads(chunk.removeprefix("data: ")) for chunk in chunks]


async def error_of(response: Any, status: int) -> dict[str, str]:
    assert response.status == status
    body = await response.json()
    assert set(body) == {"error"}
    assert {"type", "message"} <= set(body["error"])
    return dict(body["error"])


# -- without an engine ------------------------------------------------------------------------


async def test_health_needs_no_engine(client: Client) -> None:
    response = await client.get("/health")
    assert response.status == 200 and await response.json() == {"status": "ok"}


async def test_not_ready_without_engine(client: Client) -> None:
    error = await error_of(await client.get("/ready"), 503)
    assert error["reason"] == "engine_unavailable"


async def test_generate_without_engine_is_503(client: Client) -> None:
    response = await client.post("/generate", json={"prompt": "hi"})
    error = await error_of(response, 503)
    assert error["reason"] == "engine_unavailable"
    assert int(response.headers["Retry-After"]) >= 1


async def test_bad_input_is_400_even_without_engine(client: Client) -> None:
    headers = {"Content-Type": "application/json"}
    error = await error_of(await client.post("/generate", data=b"{nope", headers=headers), 400)
    assert error["type"] == "invalid_request"


async def test_a_body_not_said_to_be_json_is_415(client: Client) -> None:
    response = await client.post("/generate", data=b'{"prompt": "x"}')  # octet-stream
    assert (await error_of(response, 415))["type"] == "unsupported_media_type"


async def test_aiohttp_errors_have_the_json_shape(client: Client) -> None:
    assert (await error_of(await client.get("/nowhere"), 404))["type"] == "not_found"
    response = await client.get("/generate")
    assert (await error_of(response, 405))["type"] == "method_not_allowed"
    assert "POST" in response.headers["Allow"]
    big = b'{"prompt": "' + b"a" * (2 * 1024 * 1024) + b'"}'
    too_big = await client.post("/generate", data=big, headers={"Content-Type": "application/json"})
    assert (await error_of(too_big, 413))["type"] == "request_too_large"


# -- with the stand-in engine -----------------------------------------------------------------


async def test_ready_after_handshake(served: Client) -> None:
    response = await served.get("/ready")
    assert response.status == 200
    assert await response.json() == {"status": "ready", "model": "fake"}


async def test_generate_json(served: Client, engine: FakeEngine) -> None:
    body = {"prompt": "Hi there", "max_tokens": 8, "temperature": 0.5, "stop": "x",
            "priority": 3, "tenant": "t1", "seed": 9}  # fmt: skip
    response = await served.post("/generate", json=body)
    assert response.status == 200
    reply = await response.json()
    submit = engine.submits[0]
    assert reply == {
        "id": submit.request_id,
        "text": "Hello",
        "finish_reason": "stop",
        "usage": {
            "prompt_tokens": len(submit.prompt_ids),
            "completion_tokens": 2,
            "cached_tokens": 0,
        },
    }
    assert response.headers["X-Request-Id"] == submit.request_id
    assert submit.sampling == protocol.SamplingParams(0.5, 1.0, 0, 9, ["x"])
    assert (submit.max_tokens, submit.priority, submit.tenant) == (8, 3, "t1")
    assert submit.frontend_id == served.app[CLIENT].frontend_id
    assert submit.prompt_ids


async def test_generate_sse(served: Client, engine: FakeEngine) -> None:
    response = await served.post("/generate", json={"prompt": "Hi", "stream": True})
    assert response.status == 200
    assert response.headers["Content-Type"] == "text/event-stream"
    assert response.headers["Cache-Control"] == "no-cache"
    assert response.headers["X-Accel-Buffering"] == "no"
    rid = engine.submits[0].request_id
    assert response.headers["X-Request-Id"] == rid
    events = await sse_events(response)
    assert events[:-1] == [{"id": rid, "text": "Hel"}, {"id": rid, "text": "lo"}]
    prompt_tokens = len(engine.submits[0].prompt_ids)
    assert events[-1] == {
        "id": rid,
        "text": "",
        "finish_reason": "stop",
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 2, "cached_tokens": 0},
    }


async def test_sse_joins_a_character_split_across_ticks(served: Client, engine: FakeEngine) -> None:
    emoji = "😀".encode()
    engine.script = lambda submit: [
        [accepted()],
        *[[{"token_ids": [i], "text": emoji[i : i + 1]}] for i in range(4)],
        [{"finish_reason": protocol.FINISH_LENGTH}],
    ]
    response = await served.post("/generate", json={"prompt": "Hi", "stream": True})
    events = await sse_events(response)
    assert [e.get("text") for e in events[:-1]] == ["😀"]  # empty deltas are skipped
    assert events[-1]["finish_reason"] == "length"
    assert events[-1]["usage"]["completion_tokens"] == 4


async def test_timeline_on_request(served: Client, engine: FakeEngine) -> None:
    engine.script = lambda submit: [
        [accepted(finish_reason="stop", timeline={"queued_ns": 5})],
    ]
    reply = await (await served.post("/generate", json={"prompt": "Hi", "timeline": True})).json()
    assert reply["timeline"] == {"queued_ns": 5}


async def test_context_length_exceeded_is_400(served: Client, engine: FakeEngine) -> None:
    response = await served.post("/generate", json={"prompt": "word " * 600, "max_tokens": 8})
    error = await error_of(response, 400)
    assert error["type"] == "context_length_exceeded"
    assert error["message"].startswith("prompt is too long: 601 tokens > 511 maximum")
    assert engine.submits == []


async def test_queue_full_is_rejected_before_the_engine(served: Client, engine: FakeEngine) -> None:
    engine.publish_load(waiting=MAX_QUEUE, running=4, drain_rate=0.5)
    response = await served.post("/generate", json={"prompt": "Hi"})
    error = await error_of(response, 503)
    assert error["reason"] == "queue_full"
    assert response.headers["Retry-After"] == "8"  # the 4 queued must leave, at 0.5/s
    assert engine.submits == []


async def test_draining_engine_is_not_ready(served: Client, engine: FakeEngine) -> None:
    engine.publish_load(state=protocol.STATE_DRAINING, running=2, drain_rate=1.0)
    ready = await served.get("/ready")
    assert (await error_of(ready, 503))["reason"] == "draining"
    response = await served.post("/generate", json={"prompt": "Hi"})
    assert (await error_of(response, 503))["reason"] == "draining"
    assert response.headers["Retry-After"] == "2"
    assert engine.submits == []


async def test_engine_rejection_is_a_503(served: Client, engine: FakeEngine) -> None:
    engine.script = lambda submit: [
        [{"finish_reason": protocol.FINISH_REJECTED, "detail": protocol.REJECT_QUEUE_FULL}]
    ]
    for stream in (False, True):
        response = await served.post("/generate", json={"prompt": "Hi", "stream": stream})
        assert (await error_of(response, 503))["reason"] == "queue_full"
        assert int(response.headers["Retry-After"]) >= 1
        assert response.headers["X-Request-Id"] == engine.submits[-1].request_id


async def test_engine_rejection_too_long_is_a_400(served: Client, engine: FakeEngine) -> None:
    engine.script = lambda submit: [
        [{"finish_reason": protocol.FINISH_REJECTED, "detail": protocol.REJECT_TOO_LONG}]
    ]
    response = await served.post("/generate", json={"prompt": "Hi"})
    assert (await error_of(response, 400))["type"] == "context_length_exceeded"


async def test_engine_error_is_a_500(served: Client, engine: FakeEngine) -> None:
    engine.script = lambda submit: [
        [accepted()],
        [{"finish_reason": protocol.FINISH_ERROR, "detail": "decode failed"}],
    ]
    error = await error_of(await served.post("/generate", json={"prompt": "Hi"}), 500)
    assert error == {"type": "engine_error", "message": "decode failed"}


async def test_engine_error_mid_stream_is_the_final_event(
    served: Client, engine: FakeEngine
) -> None:
    engine.script = lambda submit: [
        [accepted(token_ids=[1], text=b"a")],
        [{"finish_reason": protocol.FINISH_ERROR, "detail": "decode failed"}],
    ]
    response = await served.post("/generate", json={"prompt": "Hi", "stream": True})
    events = await sse_events(response)
    rid = engine.submits[0].request_id
    assert events == [
        {"id": rid, "text": "a"},
        {
            "id": rid,
            "error": {"type": "engine_error", "message": "decode failed"},
            "finish_reason": "error",
            "usage": {
                "prompt_tokens": len(engine.submits[0].prompt_ids),
                "completion_tokens": 1,
                "cached_tokens": 0,
            },
        },
    ]


async def test_sequence_gap_ends_the_stream(served: Client, engine: FakeEngine) -> None:
    engine.script = lambda submit: [
        [accepted()],
        [{"seq": 2, "token_ids": [1], "text": b"x"}],
    ]
    response = await served.post("/generate", json={"prompt": "Hi", "stream": True})
    events = await asyncio.wait_for(sse_events(response), 5)
    assert events[-1]["finish_reason"] == "error"
    assert events[-1]["error"]["type"] == "engine_error"
    # The engine still holds the request: the frontend told it to stop.
    await until(lambda: len(engine.cancels) == 1)


async def test_other_finish_reasons_are_200(served: Client, engine: FakeEngine) -> None:
    for reason in ("length", "cancelled", "queue_timeout", "timeout"):
        engine.script = lambda submit, reason=reason: [[accepted(finish_reason=reason)]]
        response = await served.post("/generate", json={"prompt": "Hi"})
        assert response.status == 200
        assert (await response.json())["finish_reason"] == reason


async def test_client_going_away_cancels_in_engine(served: Client, engine: FakeEngine) -> None:
    engine.script = lambda submit: (
        [[accepted()]] + [[{"token_ids": [1], "text": b"x"}] for _ in range(1000)]
    )
    response = await served.post("/generate", json={"prompt": "Hi", "stream": True})
    assert (await response.content.readuntil(b"\n\n")).startswith(b"data: ")
    response.close()
    await until(lambda: len(engine.cancels) == 1)
    assert engine.cancels[0].request_id == engine.submits[0].request_id
    assert engine.cancels[0].reason == protocol.FINISH_CANCELLED


async def test_pending_counts_until_accepted(served: Client, engine: FakeEngine) -> None:
    release = asyncio.Event()

    def slow_accept(submit: protocol.Submit) -> list[list[dict[str, Any]]]:
        return [[accepted(finish_reason="stop")]] if release.is_set() else []

    engine.script = slow_accept
    request = asyncio.create_task(served.post("/generate", json={"prompt": "Hi"}))
    await until(lambda: len(engine.submits) == 1)
    assert served.app[CLIENT].pending() == 1
    request.cancel()
    await until(lambda: len(engine.cancels) == 1)
    assert served.app[CLIENT].pending() == 0


async def test_malformed_update_mid_stream_still_ends_with_one_final_event(
    served: Client, engine: FakeEngine
) -> None:
    # A str where the protocol says bytes: the frame is dropped at decoding, the next update
    # shows the gap, and the client still gets one end.
    engine.script = lambda submit: [
        [accepted(token_ids=[1], text=b"a")],
        [{"token_ids": [2], "text": "not bytes"}],
        [{"finish_reason": protocol.FINISH_STOP}],
    ]
    response = await served.post("/generate", json={"prompt": "Hi", "stream": True})
    events = await sse_events(response)
    assert [e.get("finish_reason") for e in events] == [None, "error"]
    assert events[-1]["error"]["type"] == "engine_error"
    assert "update 1 missing" in events[-1]["error"]["message"]
    await until(lambda: len(engine.cancels) == 1)
