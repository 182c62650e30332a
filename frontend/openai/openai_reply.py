"""OpenAI-format replies (completions and chat), on ``request.reply_common``'s shared machinery.

JSON: ``Completion`` / ``ChatCompletion`` (``models.openai_reply_bodies``). SSE: ``data: <chunk>``
events (a chat stream opens with a ``role`` delta), one chunk with the ``finish_reason``, the
usage chunk (``choices: []``) when ``stream_options.include_usage``, then ``data: [DONE]``;
with ``return_progress``, chunks of no choice report the prompt's prefill before that. A
failure after the headers went out is a ``data: {"error": {...}}`` event (``OpenAIError``),
which the openai client raises as ``APIError``, then ``[DONE]``.

Finish reasons: ``stop`` and ``length`` as they are; ``timeout`` (request time limit),
``cancelled`` and ``deadline_missed`` are output cut short, so ``length``; ``queue_timeout``
(no token made) is a 503 with Retry-After; ``error`` and ``rejected`` are errors, as on
``/generate``.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from tinyserve import protocol
from tinyserve.frontend.http.api_errors import INTERNAL_ERROR, ApiError, unavailable
from tinyserve.frontend.http.appkeys import LINK
from tinyserve.frontend.models.common import json_response, to_json
from tinyserve.frontend.models.openai_reply_bodies import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatDelta,
    Completion,
    CompletionChoice,
    CompletionChunk,
    CompletionChunkChoice,
    FinishReason,
    ToolCallDelta,
    Usage,
)
from tinyserve.frontend.models.progress import PromptProgress
from tinyserve.frontend.openai.openai_logprobs import (
    TokenLogprob,
    chat_logprobs,
    completion_logprobs,
    echo_logprobs,
    token_logprobs,
)
from tinyserve.frontend.request import admission
from tinyserve.frontend.request.admission import Load
from tinyserve.frontend.request.record import RequestRecord
from tinyserve.frontend.request.reply_common import (
    LoadNow,
    Output,
    collect,
    finish_error,
    progress_of,
    sse_event,
    write_sse,
)
from tinyserve.frontend.request.streams import Finish, Piece, RequestStream
from tinyserve.frontend.request.tokenizer import Tokenizer
from tinyserve.frontend.structured.reply_parser import ParsedReply, ReplyParser

DONE = sse_event("[DONE]")
FINISH_REASONS: dict[str, FinishReason] = {
    protocol.FINISH_STOP: "stop",
    protocol.FINISH_LENGTH: "length",
    protocol.FINISH_TIMEOUT: "length",
    protocol.FINISH_CANCELLED: "length",
    protocol.FINISH_DEADLINE_MISSED: "length",
}
Chunk = CompletionChunk | ChatCompletionChunk


@dataclass(frozen=True)
class Surface:
    """What tells a completion reply from a chat one."""

    chat: bool
    id_prefix: str


COMPLETIONS = Surface(False, "cmpl-")
CHAT = Surface(True, "chatcmpl-")
WholeChoice = CompletionChoice | ChatChoice


@dataclass(frozen=True)
class Echo:
    """What ``echo`` puts before a completion: the prompt's text, and with logprobs its first
    token (which has none) and the logprobs of the others."""

    text: str
    first_token: bytes = b""
    tokens: tuple[TokenLogprob, ...] = ()


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
        self.parser = ReplyParser()  # how a chat reply is read: as plain text unless set

    async def __call__(
        self, request: web.Request, stream: RequestStream, record: RequestRecord
    ) -> web.StreamResponse:
        load = request.app[LINK].load
        if record.generation.stream:
            events = StreamEvents(self, [record], _only_choice(stream), load)
            return await write_sse(request, record.request_id, events)
        return await self._json(stream, record, load)

    async def _json(
        self, stream: RequestStream, record: RequestRecord, load: LoadNow
    ) -> web.Response:
        output = await collect_or_error(stream, record, load())
        if isinstance(output, web.Response):
            return output
        finish = output.finish
        total = Usage.of(record.prompt_tokens_of(finish), output.tokens, finish.cached_tokens)
        choice = await self.choice(0, output)
        return self.respond(record, [choice], total, {"X-Request-Id": record.request_id})

    async def choice(self, index: int, output: Output, echo: Echo | None = None) -> WholeChoice:
        """The choice at ``index`` of a whole reply; a chat reply's text is read by the
        request's ``parser`` (thinking, text and tool calls)."""
        tokens = await self.logprobs_of(output.token_ids, output.logprobs)
        reason = FINISH_REASONS.get(output.finish.reason, "stop")
        if self.surface.chat:
            parsed = self.parser.parse(output.text, reason)
            logprobs = None if tokens is None else chat_logprobs(tokens)
            return ChatChoice(
                index=index,
                message=_message(parsed),
                logprobs=logprobs,
                finish_reason=parsed.reason,
            )
        text_logprobs = None if tokens is None else completion_logprobs(tokens, 0)
        text = output.text
        if echo is not None:
            text = echo.text + text
            if tokens is not None:
                text_logprobs = echo_logprobs(echo.first_token, echo.tokens, tokens)
        return CompletionChoice(
            index=index, text=text, logprobs=text_logprobs, finish_reason=reason
        )

    def respond(
        self,
        record: RequestRecord,
        choices: list[Any],
        total: Usage,
        headers: dict[str, str],
    ) -> web.Response:
        """The whole reply: ``choices`` (the surface's ``WholeChoice``) in the envelope of
        ``record`` (the first choice's)."""
        body = ChatCompletion if self.surface.chat else Completion
        reply = body(**self.envelope(record), choices=choices, usage=total)
        return json_response(reply, headers=headers)

    def envelope(self, record: RequestRecord) -> dict[str, Any]:
        """The fields every reply and chunk carries around its choices."""
        return {"id": self.surface.id_prefix + record.request_id, "created": self.created,
                "model": self.model}  # fmt: skip

    async def logprobs_of(
        self, token_ids: list[int], entries: list[list[Any]]
    ) -> list[TokenLogprob] | None:
        """The logprobs of these tokens, or None when the request did not ask."""
        if self.logprobs < 0:
            return None
        return await token_logprobs(self.tokenizer, token_ids, entries)

    def chunk(
        self,
        record: RequestRecord,
        text: str | None,
        tokens: list[TokenLogprob] | None,
        reason: FinishReason | None,
        *,
        text_offset: int = 0,
        first: bool = False,
        reasoning: str = "",
        calls: list[ToolCallDelta] | None = None,
        index: int = 0,
    ) -> bytes:
        """One chunk of a stream: new text (none: the finish chunk), its logprobs; a chat
        chunk's thinking and tool calls; ``index`` is the choice's when a reply has several."""
        body: Chunk
        if self.surface.chat:
            delta = ChatDelta(
                role="assistant" if first else None,
                content=None if reasoning and not text else text,
                reasoning_content=reasoning or None,
                tool_calls=calls,
            )
            logprobs = None if tokens is None else chat_logprobs(tokens)
            choice = ChatChunkChoice(
                index=index, delta=delta, logprobs=logprobs, finish_reason=reason
            )
            body = ChatCompletionChunk(**self.envelope(record), choices=[choice])
        else:
            text_logprobs = None if tokens is None else completion_logprobs(tokens, text_offset)
            one = CompletionChunkChoice(
                index=index, text=text or "", logprobs=text_logprobs, finish_reason=reason
            )
            body = CompletionChunk(**self.envelope(record), choices=[one])
        return self.chunk_event(body)

    def usage_chunk(self, record: RequestRecord, total: Usage) -> bytes:
        """The chunk after the finish that carries the usage."""
        chunk = ChatCompletionChunk if self.surface.chat else CompletionChunk
        return self.chunk_event(chunk(**self.envelope(record), choices=[], usage=total))

    def progress_chunk(self, record: RequestRecord, progress: PromptProgress) -> bytes:
        """A chunk of no choice that reports the prompt's prefill (``return_progress``)."""
        chunk = ChatCompletionChunk if self.surface.chat else CompletionChunk
        body = chunk(**self.envelope(record), choices=[], prompt_progress=progress)
        return self.chunk_event(body)

    def chunk_event(self, body: Chunk) -> bytes:
        """As OpenAI: with ``include_usage`` every chunk has a usage, null but on the last."""
        return sse_event(to_json(body, exclude=None if self.include_usage else {"usage"}))


async def collect_or_error(
    stream: RequestStream, record: RequestRecord, load: Load | None
) -> Output | web.Response:
    """The whole output of ``stream``, or the error reply its finish maps to."""
    output = await collect(stream)
    error = openai_finish_error(output.finish, load)
    if error is None:
        return output
    error.request_id = record.request_id
    return error.response("openai")


class ChoiceChunks:
    """The chunks of one choice of a streamed reply, at its ``index``; ``record`` is the
    call's (its first choice's): as OpenAI's, every chunk of a call carries one id."""

    def __init__(
        self, reply: OpenAIReply, record: RequestRecord, load: LoadNow, index: int = 0
    ) -> None:
        self._reply = reply
        self._record = record
        self._load = load
        self._index = index
        self.tokens = 0
        self._chars = 0  # text sent so far: where the next token's text_offset starts
        self.finish: Finish | None = None  # set once the finish chunk or an error event went out
        self.failed = False  # it was an error event
        self._reading = reply.parser.stream() if reply.surface.chat else None

    def opening(self) -> bytes:
        """A chat stream's first chunk: the assistant's role."""
        return self._reply.chunk(self._record, "", None, None, first=True, index=self._index)

    async def take(self, piece: Piece) -> list[bytes]:
        """The events of one piece: its delta, and its end when it carries the finish."""
        self.tokens += piece.tokens
        events = []
        progress = progress_of(self._record, piece)
        if progress is not None:
            events.append(self._reply.progress_chunk(self._record, progress))
        delta = await self._delta(piece)
        if delta is not None:
            events.append(delta)
        if piece.finish is not None:
            events += self._end(piece.finish)
            self.finish = piece.finish
        return events

    async def _delta(self, piece: Piece) -> bytes | None:
        tokens = None
        if piece.token_ids:
            tokens = await self._reply.logprobs_of(piece.token_ids, piece.logprobs)
        reasoning, text = "", piece.text
        if self._reading is not None:
            reasoning, text = self._reading.feed(piece.text)
        if not text and not reasoning and tokens is None:
            return None
        offset = self._chars
        self._chars += len(text)
        return self._reply.chunk(
            self._record,
            text,
            tokens,
            None,
            text_offset=offset,
            reasoning=reasoning,
            index=self._index,
        )

    def _end(self, finish: Finish) -> list[bytes]:
        error = openai_finish_error(finish, self._load())
        if error is not None:
            self.failed = True
            return [_error_event(error)]
        reason = FINISH_REASONS.get(finish.reason, "stop")
        events = []
        record, index = self._record, self._index
        if self._reading is not None:  # what was held back: tool calls, or text after all
            tail = self._reading.end(reason)
            reason = tail.reason
            calls = [ToolCallDelta(index=i, **call.model_dump()) for i, call in
                     enumerate(tail.calls)] or None  # fmt: skip
            if tail.content or tail.reasoning or calls:
                events.append(self._reply.chunk(
                    record, tail.content or None, None, None, reasoning=tail.reasoning,
                    calls=calls, index=index,
                ))  # fmt: skip
        events.append(self._reply.chunk(record, None, None, reason, index=index))
        return events


class StreamEvents:
    """The events of a streamed reply of one choice or several (``choices.py``): every
    choice's chunks as its pieces come, then the usage chunk when asked (summed over the
    choices) and ``[DONE]``; an error ends the whole stream."""

    def __init__(
        self,
        reply: OpenAIReply,
        records: list[RequestRecord],
        pieces: AsyncIterator[tuple[int, Piece]],
        load: LoadNow,
        prompt_tokens: int | None = None,
    ) -> None:
        self._reply = reply
        self._records = records
        self._pieces = pieces  # (choice index, piece)
        self._prompt_tokens = prompt_tokens  # None: the one choice's record says
        self._choices = [ChoiceChunks(reply, records[0], load, i) for i in range(len(records))]
        self._done = False

    async def events(self) -> AsyncGenerator[bytes, None]:
        if self._reply.surface.chat:
            for choice in self._choices:
                yield choice.opening()
        async for index, piece in self._pieces:
            choice = self._choices[index]
            for event in await choice.take(piece):
                yield event
            if choice.failed:
                break
            if all(c.finish is not None for c in self._choices):
                if self._reply.include_usage:
                    yield self._reply.usage_chunk(self._records[0], self._usage())
                break
        yield DONE
        self._done = True

    def failure_events(self) -> list[bytes]:
        choices = self._choices
        ended = all(c.finish is not None for c in choices) or any(c.failed for c in choices)
        ending = [] if ended else [_error_event(internal_error())]
        return ending + ([] if self._done else [DONE])

    def _usage(self) -> Usage:
        finishes = [c.finish for c in self._choices if c.finish is not None]
        prompt_tokens = self._prompt_tokens
        if prompt_tokens is None:
            prompt_tokens = self._records[0].prompt_tokens_of(finishes[0])
        completion_tokens = sum(c.tokens for c in self._choices)
        return Usage.of(prompt_tokens, completion_tokens, sum(f.cached_tokens for f in finishes))


async def _only_choice(stream: RequestStream) -> AsyncIterator[tuple[int, Piece]]:
    async for piece in stream.pieces():
        yield 0, piece


def _message(parsed: ParsedReply) -> AssistantMessage:
    """A whole reply's message: no content when it is only tool calls."""
    return AssistantMessage(
        content=parsed.content if parsed.content or not parsed.calls else None,
        reasoning_content=parsed.reasoning or None,
        tool_calls=parsed.calls or None,
    )


def _error_event(error: ApiError) -> bytes:
    # The openai client raises an APIError for an event whose data holds "error".
    return sse_event(error.openai_body())


def internal_error() -> ApiError:
    return ApiError(500, INTERNAL_ERROR, "internal server error")
