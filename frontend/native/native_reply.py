"""The native ``/generate`` reply format, on top of ``request.reply_common``.

JSON: ``GenerateReply``; SSE: a ``GenerateDelta`` per non-empty text delta (and, with
``return_progress``, a ``GenerateProgress`` as the prompt's prefill goes), then exactly one
final event, a ``GenerateReply`` with empty text or, on failure, a ``GenerateFailure``
(``models.native``). The final object carries the timeline when the client asked for it.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any, cast

from aiohttp import web

from tinyserve.frontend.http.api_errors import INTERNAL_ERROR
from tinyserve.frontend.http.appkeys import LINK
from tinyserve.frontend.models.common import json_response
from tinyserve.frontend.models.errors import ErrorDetail
from tinyserve.frontend.models.native import (
    GenerateDelta,
    GenerateFailure,
    GenerateProgress,
    GenerateReply,
    NativeFinishReason,
    NativeUsage,
    PromptTokenLogprob,
    TokenLogprob,
)
from tinyserve.frontend.openai.openai_logprobs import finite
from tinyserve.frontend.request.admission import Load
from tinyserve.frontend.request.record import RequestRecord
from tinyserve.frontend.request.reply_common import (
    LoadNow,
    collect,
    finish_error,
    progress_of,
    sse_event,
    write_sse,
)
from tinyserve.frontend.request.streams import Finish, RequestStream


async def native_reply(
    request: web.Request, stream: RequestStream, record: RequestRecord
) -> web.StreamResponse:
    """``/generate``'s reply: SSE or one JSON object, as the request asked."""
    load = request.app[LINK].load
    if record.generation.stream:
        return await write_sse(request, record.request_id, _NativeEvents(stream, record, load))
    return await json_reply(stream, record, load)


async def json_reply(stream: RequestStream, record: RequestRecord, load: LoadNow) -> web.Response:
    """Wait for the whole output; reply 200 with it, or with the error the finish maps to."""
    output = await collect(stream)
    error = finish_error(output.finish, load())
    if error is not None:
        error.request_id = record.request_id
        return error.response()
    reply = _reply(record, output.finish, output.tokens, output.text, output.prompt_logprobs)
    return json_response(reply, headers={"X-Request-Id": record.request_id})


class _NativeEvents:
    """Text deltas as they are decoded, then the one final event."""

    def __init__(self, stream: RequestStream, record: RequestRecord, load: LoadNow) -> None:
        self._stream = stream
        self._record = record
        self._load = load
        self._tokens = 0
        self._prompt_logprobs: list[list[Any]] = []  # the engine's, for the final event
        self._final_sent = False

    async def events(self) -> AsyncGenerator[bytes, None]:
        record = self._record
        async for piece in self._stream.pieces():
            self._tokens += piece.tokens
            self._prompt_logprobs += piece.prompt_logprobs
            progress = progress_of(record, piece)
            if progress is not None:
                yield sse_event(GenerateProgress(id=record.request_id, prompt_progress=progress))
            if piece.text:
                yield sse_event(GenerateDelta(id=record.request_id, text=piece.text))
            if piece.finish is not None:
                final = _final_event(
                    record, piece.finish, self._tokens, self._prompt_logprobs, self._load()
                )
                yield sse_event(final)
                self._final_sent = True  # resumed only once the final event was written

    def failure_events(self) -> list[bytes]:
        if self._final_sent:
            return []
        event = GenerateFailure(
            id=self._record.request_id,
            error=ErrorDetail(type=INTERNAL_ERROR, message="internal server error"),
            usage=NativeUsage(
                prompt_tokens=self._record.prompt_tokens,
                completion_tokens=self._tokens,
                cached_tokens=0,
            ),
        )
        return [sse_event(event)]


def _final_event(
    record: RequestRecord,
    finish: Finish,
    tokens: int,
    prompt_entries: list[list[Any]],
    load: Load | None,
) -> GenerateReply | GenerateFailure:
    error = finish_error(finish, load)
    if error is None:
        return _reply(record, finish, tokens, "", prompt_entries)
    return GenerateFailure(
        id=record.request_id,
        error=error.body().error,
        usage=_usage(record, finish, tokens),
        timeline=_timeline(record, finish),
    )


def _reply(
    record: RequestRecord, finish: Finish, tokens: int, text: str, prompt_entries: list[list[Any]]
) -> GenerateReply:
    """The reply, or a stream's final event (with empty ``text``); ``prompt_entries`` are
    the engine's prompt logprobs."""
    return GenerateReply(
        id=record.request_id,
        text=text,
        finish_reason=cast(NativeFinishReason, finish.reason),  # errors went another way
        usage=_usage(record, finish, tokens),
        timeline=_timeline(record, finish),
        prompt_logprobs=_prompt_logprobs(record, prompt_entries),
    )


def _prompt_logprobs(
    record: RequestRecord, entries: list[list[Any]]
) -> list[PromptTokenLogprob | None] | None:
    """The engine's entries paired with the prompt's tokens (the first has none)."""
    if record.generation.prompt_logprobs < 0:
        return None
    scored = [
        PromptTokenLogprob(
            token_id=token,
            logprob=finite(logprob),
            top_logprobs=[TokenLogprob(token_id=int(t), logprob=finite(lp)) for t, lp in top],
        )
        for token, (logprob, top) in zip(record.prompt_ids[1:], entries, strict=False)
    ]
    return [None, *scored]


def _usage(record: RequestRecord, finish: Finish, completion_tokens: int) -> NativeUsage:
    return NativeUsage(
        prompt_tokens=record.prompt_tokens_of(finish),
        completion_tokens=completion_tokens,
        cached_tokens=finish.cached_tokens,
    )


def _timeline(record: RequestRecord, finish: Finish) -> dict[str, Any] | None:
    return finish.timeline if record.generation.timeline else None
