"""The native ``/generate`` reply format.

JSON: ``GenerateReply``; SSE: a ``GenerateDelta`` per non-empty text delta (and, with
``return_progress``, a ``GenerateProgress`` as the prompt's prefill goes), then exactly one
final event, a ``GenerateReply`` with empty text or, on failure, a ``GenerateFailure``
(``native_bodies``). The final object carries the timeline when the client asked for it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from aiohttp import web

from tinyserve.frontend.chat.logprobs import finite
from tinyserve.frontend.link.board_view import NodeLoad
from tinyserve.frontend.link.streams import text_of
from tinyserve.frontend.models.common import json_response
from tinyserve.frontend.models.errors import internal_error
from tinyserve.frontend.native.native_bodies import (
    GenerateDelta,
    GenerateFailure,
    GenerateProgress,
    GenerateReply,
    NativeFinishReason,
    NativeTokenLogprob,
    NativeUsage,
    PromptTokenLogprob,
)
from tinyserve.frontend.request.admission import ending_error
from tinyserve.frontend.request.record import RequestRecord
from tinyserve.frontend.request.sse import (
    KEEPALIVE,
    MARK,
    Events,
    EventTemplate,
    progress_of,
    sse_event,
)
from tinyserve.protocol import RequestUpdate


class NativeReply:
    """``/generate``'s reply: SSE or one JSON object, as the request asked (``sse.Answer``).
    A queue timeout is an ending it reports, as every other."""

    keepalive = KEEPALIVE
    queue_timeout_refused = False

    def events(self, record: RequestRecord, load: Callable[[], NodeLoad | None]) -> Events:
        return _NativeEvents(record, load)

    async def whole(self, record: RequestRecord, whole: RequestUpdate) -> web.Response:
        reply = _reply(record, whole, text_of(whole), whole.prompt_logprobs)
        return json_response(reply, headers={"X-Request-Id": record.request_id})


class _NativeEvents:
    """Text deltas as they come, then the one final event (``sse.Events``)."""

    def __init__(self, record: RequestRecord, load: Callable[[], NodeLoad | None]) -> None:
        self._record = record
        self._load = load
        self._prompt_logprobs: list[list[Any]] = []  # the engine's, for the final event
        self._delta = EventTemplate(sse_event(GenerateDelta(id=record.request_id, text=MARK)))
        self.ended = False

    def opening(self) -> list[bytes]:
        return []

    async def take(self, update: RequestUpdate) -> list[bytes]:
        record, events = self._record, []
        self._prompt_logprobs += update.prompt_logprobs
        progress = progress_of(record, update)
        if progress is not None:
            body = GenerateProgress(id=record.request_id, prompt_progress=progress)
            events.append(sse_event(body))
        text = text_of(update)
        if text:
            events.append(self._delta(text))
        if update.finish_reason is not None:
            final = _final(record, update, self._prompt_logprobs, self._load())
            events.append(sse_event(final))
            self.ended = True
        return events

    def failure_events(self) -> list[bytes]:
        if self.ended:
            return []
        event = GenerateFailure(
            id=self._record.request_id,
            error=internal_error().body().error,
            usage=NativeUsage.of(self._record.counts()),
        )
        return [sse_event(event)]


def _final(
    record: RequestRecord,
    end: RequestUpdate,
    prompt_entries: list[list[Any]],
    load: NodeLoad | None,
) -> GenerateReply | GenerateFailure:
    error = ending_error(end, load)
    if error is None:
        return _reply(record, end, "", prompt_entries)
    return GenerateFailure(
        id=record.request_id,
        error=error.body().error,
        usage=NativeUsage.of(record.counts(end)),
        timeline=_timeline(record, end),
    )


def _reply(
    record: RequestRecord, end: RequestUpdate, text: str, prompt_entries: list[list[Any]]
) -> GenerateReply:
    """The reply, or a stream's final event (with empty ``text``); ``prompt_entries`` are
    the engine's prompt logprobs."""
    return GenerateReply(
        id=record.request_id,
        text=text,
        finish_reason=cast(NativeFinishReason, end.finish_reason),  # errors went another way
        usage=NativeUsage.of(record.counts(end)),
        timeline=_timeline(record, end),
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
            top_logprobs=[NativeTokenLogprob(token_id=int(t), logprob=finite(lp)) for t, lp in top],
        )
        for token, (logprob, top) in zip(record.prompt_ids[1:], entries, strict=False)
    ]
    return [None, *scored]


def _timeline(record: RequestRecord, end: RequestUpdate) -> dict[str, Any] | None:
    return end.timeline if record.generation.timeline else None
