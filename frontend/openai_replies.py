"""OpenAI-format replies (completions and chat), on the shared reply machinery of ``replies``.

JSON: ``{"id", "object", "created", "model", "choices": [one choice], "usage"}``.
SSE: ``data: <chunk>`` events (a chat stream opens with a ``role`` delta), one chunk with the
``finish_reason``, the usage chunk (``choices: []``) when ``stream_options.include_usage``,
then ``data: [DONE]``. A failure after the headers went out is a ``data: {"error": {...}}``
event, which the openai client raises as ``APIError``, then ``[DONE]``.

Finish reasons: ``stop`` and ``length`` as they are; ``timeout`` (request time limit) and
``cancelled`` are output cut short, so ``length``; ``queue_timeout`` (no token made) is a 503
with Retry-After; ``error`` and ``rejected`` are errors, as on ``/generate``.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from tinyserve import protocol
from tinyserve.frontend import admission
from tinyserve.frontend.admission import Load
from tinyserve.frontend.api_errors import INTERNAL_ERROR, ApiError, unavailable
from tinyserve.frontend.openai_logprobs import chat_logprobs, completion_logprobs, token_logprobs
from tinyserve.frontend.replies import (
    ReplyContext,
    collect,
    dumps,
    finish_error,
    sse_event,
    write_sse,
)
from tinyserve.frontend.streams import Finish, Piece, RequestStream
from tinyserve.frontend.tokenizer import Tokenizer

DONE = sse_event("[DONE]")
FINISH_REASONS = {
    protocol.FINISH_STOP: "stop",
    protocol.FINISH_LENGTH: "length",
    protocol.FINISH_TIMEOUT: "length",
    protocol.FINISH_CANCELLED: "length",
}


@dataclass(frozen=True)
class Surface:
    """What tells a completion reply from a chat one."""

    chat: bool
    object: str
    chunk_object: str
    id_prefix: str


COMPLETIONS = Surface(False, "text_completion", "text_completion", "cmpl-")
CHAT = Surface(True, "chat.completion", "chat.completion.chunk", "chatcmpl-")


def openai_finish_error(finish: Finish, load: Load | None) -> ApiError | None:
    """``finish_error``, plus a 503 for a request that timed out before its first token."""
    error = finish_error(finish, load)
    if error is None and finish.reason == protocol.FINISH_QUEUE_TIMEOUT:
        rejection = admission.engine_rejection(finish.reason, load or admission.IDLE_LOAD)
        assert rejection.retry_after is not None
        message = "the request timed out waiting for a free slot"
        error = unavailable(finish.reason, message, rejection.retry_after)
    return error


class OpenAIReply:
    """The ``Reply`` of one OpenAI request (see ``pipeline.run``)."""

    def __init__(
        self, surface: Surface, model: str, include_usage: bool, tokenizer: Tokenizer, logprobs: int
    ) -> None:
        self.surface = surface
        self.model = model
        self.include_usage = include_usage
        self.tokenizer = tokenizer
        self.logprobs = logprobs  # -1: none
        self.created = int(time.time())

    async def __call__(
        self, request: web.Request, stream: RequestStream, ctx: ReplyContext
    ) -> web.StreamResponse:
        if ctx.stream:
            return await write_sse(request, ctx.request_id, _Events(self, stream, ctx))
        return await self._json(stream, ctx)

    async def _json(self, stream: RequestStream, ctx: ReplyContext) -> web.Response:
        output = await collect(stream)
        error = openai_finish_error(output.finish, ctx.load())
        if error is not None:
            error.request_id = ctx.request_id
            return error.response(openai=True)
        logprobs = await self.logprobs_of(output.token_ids, output.logprobs, 0)
        reason = FINISH_REASONS.get(output.finish.reason, "stop")
        if self.surface.chat:
            message = {"role": "assistant", "content": output.text}
            choice = {"index": 0, "message": message, "logprobs": logprobs, "finish_reason": reason}
        else:
            choice = {
                "index": 0,
                "text": output.text,
                "logprobs": logprobs,
                "finish_reason": reason,
            }
        body = self.envelope(ctx, self.surface.object, [choice])
        body["usage"] = usage(ctx, output.finish, output.tokens)
        return web.json_response(body, headers={"X-Request-Id": ctx.request_id}, dumps=dumps)

    def envelope(self, ctx: ReplyContext, object_: str, choices: list[Any]) -> dict[str, Any]:
        """The fields every reply and chunk carries around its choices."""
        return {
            "id": self.surface.id_prefix + ctx.request_id,
            "object": object_,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }

    async def logprobs_of(
        self, token_ids: list[int], entries: list[list[Any]], text_offset: int
    ) -> dict[str, Any] | None:
        """The logprobs object of these tokens, or None when the request did not ask."""
        if self.logprobs < 0:
            return None
        tokens = await token_logprobs(self.tokenizer, token_ids, entries)
        if self.surface.chat:
            return chat_logprobs(tokens)
        return completion_logprobs(tokens, text_offset)


def usage(ctx: ReplyContext, finish: Finish, completion_tokens: int) -> dict[str, Any]:
    """OpenAI's usage object; ``cached_tokens`` counts prompt tokens the prefix cache served."""
    prompt_tokens = ctx.prompt_tokens_of(finish)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": finish.cached_tokens},
    }


class _Events:
    """The chunks of one streamed reply."""

    def __init__(self, reply: OpenAIReply, stream: RequestStream, ctx: ReplyContext) -> None:
        self._reply = reply
        self._stream = stream
        self._ctx = ctx
        self._tokens = 0
        self._chars = 0  # text sent so far: where the next token's text_offset starts
        self._ended = False  # the finish chunk or an error event went out
        self._done = False

    async def events(self) -> AsyncGenerator[bytes, None]:
        if self._reply.surface.chat:
            yield self._chunk({"role": "assistant", "content": ""}, None, None)
        async for piece in self._stream.pieces():
            self._tokens += piece.tokens
            delta = await self._delta(piece)
            if delta is not None:
                yield delta
            if piece.finish is not None:
                for event in self._end(piece.finish):
                    yield event
                self._ended = True
        yield DONE
        self._done = True

    def failure_events(self) -> list[bytes]:
        ending = [] if self._ended else [_error_event(_internal_error())]
        return ending + ([] if self._done else [DONE])

    async def _delta(self, piece: Piece) -> bytes | None:
        logprobs = None
        if piece.token_ids:
            logprobs = await self._reply.logprobs_of(piece.token_ids, piece.logprobs, self._chars)
        if not piece.text and logprobs is None:
            return None
        self._chars += len(piece.text)
        content = {"content": piece.text} if self._reply.surface.chat else piece.text
        return self._chunk(content, logprobs, None)

    def _end(self, finish: Finish) -> list[bytes]:
        error = openai_finish_error(finish, self._ctx.load())
        if error is not None:
            return [_error_event(error)]
        reason = FINISH_REASONS.get(finish.reason, "stop")
        events = [self._chunk({} if self._reply.surface.chat else "", None, reason)]
        if self._reply.include_usage:
            body = self._reply.envelope(self._ctx, self._reply.surface.chunk_object, [])
            body["usage"] = usage(self._ctx, finish, self._tokens)
            events.append(sse_event(body))
        return events

    def _chunk(self, content: Any, logprobs: dict[str, Any] | None, reason: str | None) -> bytes:
        key = "delta" if self._reply.surface.chat else "text"
        choice = {"index": 0, key: content, "logprobs": logprobs, "finish_reason": reason}
        body = self._reply.envelope(self._ctx, self._reply.surface.chunk_object, [choice])
        if self._reply.include_usage:
            body["usage"] = None  # as OpenAI: every chunk but the last has a null usage
        return sse_event(body)


def _error_event(error: ApiError) -> bytes:
    # The openai client raises an APIError for an event whose data holds "error".
    return sse_event(error.openai_body())


def _internal_error() -> ApiError:
    return ApiError(500, INTERNAL_ERROR, "internal server error")
