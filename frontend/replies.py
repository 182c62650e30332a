"""Turning a request's stream into the HTTP reply: one JSON object, or Server-Sent Events.

JSON: ``{"id", "text", "finish_reason", "usage": {"prompt_tokens", "completion_tokens"}}``.
SSE: ``data: {"id", "text"}`` per non-empty text delta, then exactly one final event,
``{"id", "text": "", "finish_reason", "usage"}`` or, on failure,
``{"id", "error": {"type", "message"}, "finish_reason": "error", "usage"}``.
A ``"timeline"`` key is added to the final object when the client asked for it.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from tinyserve import protocol
from tinyserve.frontend import admission
from tinyserve.frontend.admission import Load, Rejection
from tinyserve.frontend.api_errors import (
    ENGINE_ERROR,
    INTERNAL_ERROR,
    REASON_ENGINE_UNAVAILABLE,
    ApiError,
    too_long,
    unavailable,
)
from tinyserve.frontend.streams import Finish, RequestStream
from tinyserve.logs import fields

log = logging.getLogger(__name__)

SSE_HEADERS = {
    "Content-Type": "text/event-stream",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",  # nginx: pass each event on at once
}


@dataclass(frozen=True)
class ReplyContext:
    """What a reply needs besides the stream."""

    request_id: str
    prompt_tokens: int  # our own count, used when the engine's final update has none
    want_timeline: bool
    load: Callable[[], Load | None]  # current load, for a Retry-After computed at reply time


def rejection_error(rejection: Rejection) -> ApiError:
    """The HTTP error for an admission (or engine) rejection."""
    if rejection.status == 400:
        return too_long(rejection.message)
    assert rejection.retry_after is not None
    return unavailable(rejection.reason, rejection.message, rejection.retry_after)


def engine_unavailable(detail: str = "engine unavailable") -> ApiError:
    """A 503 for requests that arrive, or are cut off, while no engine is serving."""
    return unavailable(REASON_ENGINE_UNAVAILABLE, detail, admission.ENGINE_DOWN_RETRY_S)


def finish_error(finish: Finish, load: Load | None) -> ApiError | None:
    """The HTTP error a finish maps to (rejected, error), or None for a normal ending."""
    if finish.reason == protocol.FINISH_REJECTED:
        return rejection_error(
            admission.engine_rejection(finish.detail, load or admission.IDLE_LOAD)
        )
    if finish.reason != protocol.FINISH_ERROR:
        return None
    if finish.engine_down:
        return engine_unavailable(finish.detail)
    return ApiError(500, ENGINE_ERROR, finish.detail or "engine error")


async def json_reply(stream: RequestStream, ctx: ReplyContext) -> web.Response:
    """Wait for the whole output; reply 200 with it, or with the error the finish maps to."""
    parts: list[str] = []
    tokens = 0
    finish: Finish | None = None
    async for piece in stream.pieces():
        parts.append(piece.text)
        tokens += piece.tokens
        finish = piece.finish
    assert finish is not None
    error = finish_error(finish, ctx.load())
    if error is not None:
        error.request_id = ctx.request_id
        return error.response()
    body: dict[str, Any] = {
        "id": ctx.request_id,
        "text": "".join(parts),
        "finish_reason": finish.reason,
        "usage": _usage(ctx, finish, tokens),
    }
    _add_timeline(body, ctx, finish)
    return web.json_response(body, headers={"X-Request-Id": ctx.request_id}, dumps=_dumps)


async def sse_reply(
    request: web.Request, stream: RequestStream, ctx: ReplyContext
) -> web.StreamResponse:
    """Stream text deltas as they are decoded, then the one final event."""
    response = web.StreamResponse(headers={**SSE_HEADERS, "X-Request-Id": ctx.request_id})
    await response.prepare(request)
    tokens = 0
    final_sent = False
    try:
        async for piece in stream.pieces():
            tokens += piece.tokens
            if piece.text:
                await response.write(_event({"id": ctx.request_id, "text": piece.text}))
            if piece.finish is not None:
                await response.write(_event(_final_event(ctx, piece.finish, tokens)))
                final_sent = True
        await response.write_eof()
    except ConnectionResetError:
        # The client is gone; the handler's cleanup cancels the request in the engine.
        log.info("client went away mid-stream", extra=fields(request_id=ctx.request_id))
    except Exception:
        # A bug of ours after the headers went out: still end with the one final event.
        log.exception("stream failed", extra=fields(request_id=ctx.request_id))
        if not final_sent:
            await _write_internal_error(response, ctx, tokens)
    return response


async def _write_internal_error(
    response: web.StreamResponse, ctx: ReplyContext, tokens: int
) -> None:
    event = {
        "id": ctx.request_id,
        "error": {"type": INTERNAL_ERROR, "message": "internal server error"},
        "finish_reason": protocol.FINISH_ERROR,
        "usage": {"prompt_tokens": ctx.prompt_tokens, "completion_tokens": tokens},
    }
    with contextlib.suppress(ConnectionResetError):
        await response.write(_event(event))
        await response.write_eof()


def _final_event(ctx: ReplyContext, finish: Finish, tokens: int) -> dict[str, Any]:
    event: dict[str, Any] = {"id": ctx.request_id}
    error = finish_error(finish, ctx.load())
    if error is None:
        event.update(text="", finish_reason=finish.reason)
    else:
        event.update(error=error.body()["error"], finish_reason=protocol.FINISH_ERROR)
    event["usage"] = _usage(ctx, finish, tokens)
    _add_timeline(event, ctx, finish)
    return event


def _usage(ctx: ReplyContext, finish: Finish, completion_tokens: int) -> dict[str, int]:
    prompt_tokens = finish.prompt_tokens or ctx.prompt_tokens
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens}


def _add_timeline(body: dict[str, Any], ctx: ReplyContext, finish: Finish) -> None:
    if ctx.want_timeline and finish.timeline is not None:
        body["timeline"] = finish.timeline


def _dumps(data: Any) -> str:
    # default=str: an engine timeline value JSON cannot hold must not break a finished reply.
    return json.dumps(data, ensure_ascii=False, default=str)


def _event(data: dict[str, Any]) -> bytes:
    return b"data: " + _dumps(data).encode("utf-8") + b"\n\n"
