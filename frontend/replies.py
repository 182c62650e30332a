"""Turning a request's stream into the HTTP reply: one JSON object, or Server-Sent Events.

The machinery every API surface shares lives here (``collect`` for a whole output,
``write_sse`` for an event stream that always ends, ``finish_error`` for the error a finish
maps to), and so does the native ``/generate`` format on top of it:

JSON: ``GenerateReply``; SSE: a ``GenerateDelta`` per non-empty text delta, then exactly one
final event, a ``GenerateReply`` with empty text or, on failure, a ``GenerateFailure``
(``models.native``). The final object carries the timeline when the client asked for it.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

from aiohttp import web
from pydantic import BaseModel

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
from tinyserve.frontend.backpressure import ClientStalled, bound_buffers, paced_write
from tinyserve.frontend.keys import CONFIG
from tinyserve.frontend.models.common import json_response, to_json
from tinyserve.frontend.models.errors import ErrorDetail
from tinyserve.frontend.models.native import (
    GenerateDelta,
    GenerateFailure,
    GenerateReply,
    NativeFinishReason,
    NativeUsage,
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
    stream: bool = False  # the client asked for server-sent events

    def prompt_tokens_of(self, finish: Finish) -> int:
        """The prompt's length: the engine's figure, else our own count."""
        return finish.prompt_tokens or self.prompt_tokens


# How a surface answers once the engine accepted a request: the pipeline hands it the stream.
Reply = Callable[[web.Request, RequestStream, ReplyContext], Awaitable[web.StreamResponse]]


@dataclass
class Output:
    """A request's whole output, for a reply that is sent only once it is complete."""

    finish: Finish
    text: str = ""
    tokens: int = 0
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[list[Any]] = field(default_factory=list)


class EventSource(Protocol):
    """One reply's server-sent events, as ``write_sse`` writes them."""

    def events(self) -> AsyncGenerator[bytes, None]:
        """Every event of the reply, its end included."""
        ...

    def failure_events(self) -> list[bytes]:
        """What ends the stream after a bug of ours; nothing when its end already went out."""
        ...


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


async def collect(stream: RequestStream) -> Output:
    """Wait for the whole output of ``stream``."""
    parts: list[str] = []
    tokens = 0
    token_ids: list[int] = []
    logprobs: list[list[Any]] = []
    finish: Finish | None = None
    async for piece in stream.pieces():
        parts.append(piece.text)
        tokens += piece.tokens
        token_ids += piece.token_ids
        logprobs += piece.logprobs
        finish = piece.finish
    assert finish is not None
    return Output(finish, "".join(parts), tokens, token_ids, logprobs)


async def write_sse(
    request: web.Request, request_id: str, source: EventSource
) -> web.StreamResponse:
    """Send ``source``'s events as they come; a stream always ends, even after a bug of ours."""
    response = web.StreamResponse(headers={**SSE_HEADERS, "X-Request-Id": request_id})
    await response.prepare(request)
    bound_buffers(request)
    timeout_s = request.app[CONFIG].write_timeout
    try:
        async with contextlib.aclosing(source.events()) as events:
            async for event in events:
                await paced_write(request, response, event, timeout_s)
        await response.write_eof()
    except ClientStalled:
        raise  # the pipeline cancels the request and drops the connection
    except ConnectionResetError:
        # The client is gone; the handler's cleanup cancels the request in the engine.
        log.info("client went away mid-stream", extra=fields(request_id=request_id))
    except Exception:
        # A bug of ours after the headers went out: still end the stream the way the API says.
        log.exception("stream failed", extra=fields(request_id=request_id))
        with contextlib.suppress(ConnectionResetError):
            for event in source.failure_events():
                await response.write(event)
            await response.write_eof()
    return response


def sse_event(data: BaseModel | str) -> bytes:
    """One ``data:`` event; a string goes out as it is (``[DONE]``, or JSON already made)."""
    payload = data if isinstance(data, str) else to_json(data)
    return b"data: " + payload.encode("utf-8") + b"\n\n"


# -- the native /generate format ----------------------------------------------------------------


async def native_reply(
    request: web.Request, stream: RequestStream, ctx: ReplyContext
) -> web.StreamResponse:
    """``/generate``'s reply: SSE or one JSON object, as the request asked."""
    if ctx.stream:
        return await write_sse(request, ctx.request_id, _NativeEvents(stream, ctx))
    return await json_reply(stream, ctx)


async def json_reply(stream: RequestStream, ctx: ReplyContext) -> web.Response:
    """Wait for the whole output; reply 200 with it, or with the error the finish maps to."""
    output = await collect(stream)
    error = finish_error(output.finish, ctx.load())
    if error is not None:
        error.request_id = ctx.request_id
        return error.response()
    reply = _reply(ctx, output.finish, output.tokens, output.text)
    return json_response(reply, headers={"X-Request-Id": ctx.request_id})


class _NativeEvents:
    """Text deltas as they are decoded, then the one final event."""

    def __init__(self, stream: RequestStream, ctx: ReplyContext) -> None:
        self._stream = stream
        self._ctx = ctx
        self._tokens = 0
        self._final_sent = False

    async def events(self) -> AsyncGenerator[bytes, None]:
        ctx = self._ctx
        async for piece in self._stream.pieces():
            self._tokens += piece.tokens
            if piece.text:
                yield sse_event(GenerateDelta(id=ctx.request_id, text=piece.text))
            if piece.finish is not None:
                yield sse_event(_final_event(ctx, piece.finish, self._tokens))
                self._final_sent = True  # resumed only once the final event was written

    def failure_events(self) -> list[bytes]:
        if self._final_sent:
            return []
        event = GenerateFailure(
            id=self._ctx.request_id,
            error=ErrorDetail(type=INTERNAL_ERROR, message="internal server error"),
            usage=NativeUsage(
                prompt_tokens=self._ctx.prompt_tokens,
                completion_tokens=self._tokens,
                cached_tokens=0,
            ),
        )
        return [sse_event(event)]


def _final_event(ctx: ReplyContext, finish: Finish, tokens: int) -> GenerateReply | GenerateFailure:
    error = finish_error(finish, ctx.load())
    if error is None:
        return _reply(ctx, finish, tokens, "")
    return GenerateFailure(
        id=ctx.request_id,
        error=error.body().error,
        usage=_usage(ctx, finish, tokens),
        timeline=_timeline(ctx, finish),
    )


def _reply(ctx: ReplyContext, finish: Finish, tokens: int, text: str) -> GenerateReply:
    return GenerateReply(
        id=ctx.request_id,
        text=text,
        finish_reason=cast(NativeFinishReason, finish.reason),  # errors went another way
        usage=_usage(ctx, finish, tokens),
        timeline=_timeline(ctx, finish),
    )


def _usage(ctx: ReplyContext, finish: Finish, completion_tokens: int) -> NativeUsage:
    return NativeUsage(
        prompt_tokens=ctx.prompt_tokens_of(finish),
        completion_tokens=completion_tokens,
        cached_tokens=finish.cached_tokens,
    )


def _timeline(ctx: ReplyContext, finish: Finish) -> dict[str, Any] | None:
    return finish.timeline if ctx.want_timeline else None
