"""The native ``/generate`` reply format, on top of ``request.reply_common``.

JSON: ``GenerateReply``; SSE: a ``GenerateDelta`` per non-empty text delta, then exactly one
final event, a ``GenerateReply`` with empty text or, on failure, a ``GenerateFailure``
(``models.native``). The final object carries the timeline when the client asked for it.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any, cast

from aiohttp import web

from tinyserve.frontend.http.api_errors import INTERNAL_ERROR
from tinyserve.frontend.models.common import json_response
from tinyserve.frontend.models.errors import ErrorDetail
from tinyserve.frontend.models.native import (
    GenerateDelta,
    GenerateFailure,
    GenerateReply,
    NativeFinishReason,
    NativeUsage,
)
from tinyserve.frontend.request.reply_common import (
    ReplyContext,
    collect,
    finish_error,
    sse_event,
    write_sse,
)
from tinyserve.frontend.request.streams import Finish, RequestStream


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
