"""OpenAI-format chunks, and the events of a streamed reply of one choice or several.

``OpenAIFormat`` is what every reply and chunk of one request carries (the envelope, whether
chunks carry ``usage``, the logprobs asked for, how a chat reply is read) and makes the
chunks; ``StreamEvents`` is what ``sse.write_sse`` writes for a stream: a chat stream opens
with a ``role`` delta per choice, then each choice's deltas at its ``index`` as its updates
come (a chat choice read by its ``ReplyStream``, as every conversation surface reads a reply:
its thinking, its text, and its tool calls as they are written, a call's start once its name
is, then its arguments), its finish
chunk, and once every choice ended the usage chunk when asked (summed over the
choices) and ``[DONE]``; an error ends the whole stream.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tinyserve.frontend.chat.ending import finish_reason, reply_error
from tinyserve.frontend.chat.logprobs import TokenLogprob, token_logprobs
from tinyserve.frontend.chat.reply_ids import CHAT_ID_PREFIX, COMPLETION_ID_PREFIX
from tinyserve.frontend.link.board_view import NodeLoad
from tinyserve.frontend.link.streams import text_of
from tinyserve.frontend.models.chat import FinishReason
from tinyserve.frontend.models.common import to_json
from tinyserve.frontend.models.errors import ApiError, internal_error
from tinyserve.frontend.models.usage import TokenCounts
from tinyserve.frontend.openai.openai_logprobs import chat_logprobs, completion_logprobs
from tinyserve.frontend.openai.openai_replies import (
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatDelta,
    CompletionChunk,
    CompletionChunkChoice,
    ToolCallDelta,
    Usage,
)
from tinyserve.frontend.prompt.tokenizer import Tokenizer
from tinyserve.frontend.request.record import RequestRecord
from tinyserve.frontend.request.sse import MARK, EventTemplate, progress_of, sse_event
from tinyserve.frontend.structured.reply_parser import CallDelta, ReplyParser
from tinyserve.protocol import RequestUpdate

DONE = sse_event("[DONE]")
Chunk = CompletionChunk | ChatCompletionChunk


@dataclass(frozen=True)
class Surface:
    """What tells a completion reply from a chat one."""

    chat: bool
    id_prefix: str


COMPLETIONS = Surface(False, COMPLETION_ID_PREFIX)
CHAT = Surface(True, CHAT_ID_PREFIX)


class OpenAIFormat:
    """The replies of one OpenAI request: its envelope and chunks; ``parser`` reads a chat
    reply (as plain text unless given)."""

    def __init__(
        self,
        surface: Surface,
        model: str,
        include_usage: bool,
        tokenizer: Tokenizer,
        logprobs: int,
        parser: ReplyParser | None = None,
    ) -> None:
        self.surface = surface
        self.model = model
        self.include_usage = include_usage
        self.tokenizer = tokenizer
        self.logprobs = logprobs  # -1: none
        self.created = int(time.time())
        self.parser = parser or ReplyParser()

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
                content=None if (reasoning or calls) and not text else text,
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

    def chunk_of_record(self, record: RequestRecord, **fields: Any) -> bytes:
        """A chunk of no choice: the usage, or the prefill's progress."""
        chunk = ChatCompletionChunk if self.surface.chat else CompletionChunk
        return self.chunk_event(chunk(**self.envelope(record), choices=[], **fields))

    def chunk_event(self, body: Chunk) -> bytes:
        """As OpenAI: with ``include_usage`` every chunk has a usage, null but on the last."""
        return sse_event(to_json(body, exclude=None if self.include_usage else {"usage"}))


class StreamEvents:
    """The events of a streamed reply (``sse.Events``) of the choices whose ``records`` are
    given, in order: every chunk carries the first one's id, as OpenAI's do."""

    def __init__(
        self,
        form: OpenAIFormat,
        records: list[RequestRecord],
        load: Callable[[], NodeLoad | None],
        prompt_tokens: int | None = None,
    ) -> None:
        self._form = form
        self._records = records
        self._load = load
        self._prompt_tokens = prompt_tokens  # None: the one choice's record says
        self._index = {record.request_id: i for i, record in enumerate(records)}
        # Per choice: its chunk of plain text, the text sent (text_offset), its reply read as
        # it comes (chat), its end once it went out.
        first = records[0]
        self._texts = [
            EventTemplate(form.chunk(first, MARK, None, None, index=i)) for i in range(len(records))
        ]
        self._chars = [0] * len(records)
        chat = form.surface.chat
        self._reading = [form.parser.stream() if chat else None for _ in records]
        self._ends: list[RequestUpdate | None] = [None] * len(records)
        self._failed = False
        self._done = False

    @property
    def ended(self) -> bool:
        return self._done

    def opening(self) -> list[bytes]:
        """A chat stream's first chunk per choice: the assistant's role."""
        if not self._form.surface.chat:
            return []
        first = self._records[0]
        return [self._form.chunk(first, "", None, None, first=True, index=i)
                for i in range(len(self._records))]  # fmt: skip

    async def take(self, update: RequestUpdate) -> list[bytes]:
        index, first, events = self._index[update.request_id], self._records[0], []
        progress = progress_of(first, update)
        if progress is not None:
            events.append(self._form.chunk_of_record(first, prompt_progress=progress))
        delta = await self._delta(index, update)
        if delta is not None:
            events.append(delta)
        if update.finish_reason is not None:
            events += self._end(index, update)
        if self._failed or all(end is not None for end in self._ends):
            if not self._failed and self._form.include_usage:
                events.append(self._form.chunk_of_record(first, usage=self._usage()))
            events.append(DONE)
            self._done = True
        return events

    def failure_events(self) -> list[bytes]:
        ended = self._failed or all(end is not None for end in self._ends)
        ending = [] if ended else [_error_event(internal_error())]
        return ending + ([] if self._done else [DONE])

    async def _delta(self, index: int, update: RequestUpdate) -> bytes | None:
        tokens = None
        if update.token_ids:
            tokens = await self._form.logprobs_of(update.token_ids, update.logprobs)
        reasoning, text, calls = "", text_of(update), None
        reading = self._reading[index]
        if reading is not None:
            parts = reading.feed(text)
            reasoning, text = parts.reasoning, parts.content
            calls = _call_deltas(parts.calls)
        if not text and not reasoning and not calls and tokens is None:
            return None
        offset = self._chars[index]
        self._chars[index] += len(text)
        if not reasoning and not calls and tokens is None:
            return self._texts[index](text)
        return self._form.chunk(
            self._records[0], text, tokens, None, text_offset=offset, reasoning=reasoning,
            calls=calls or None, index=index,
        )  # fmt: skip

    def _end(self, index: int, end: RequestUpdate) -> list[bytes]:
        error = reply_error(end, self._load())
        if error is not None:
            self._failed = True
            return [_error_event(error)]
        self._ends[index] = end
        reason, events, first = finish_reason(end), [], self._records[0]
        reading = self._reading[index]
        if reading is not None:  # what was held back: text after all, calls not streamed
            tail = reading.end(reason)
            reason = tail.reason
            whole = enumerate(tail.calls[reading.started :], reading.started)
            calls = [ToolCallDelta.start(i, call.id, call.function.name, call.function.arguments)
                     for i, call in whole]  # fmt: skip
            if tail.content or tail.reasoning or calls:
                events.append(self._form.chunk(
                    first, tail.content or None, None, None, reasoning=tail.reasoning,
                    calls=calls or None, index=index,
                ))  # fmt: skip
        events.append(self._form.chunk(first, None, None, reason, index=index))
        return events

    def _usage(self) -> Usage:
        ends = zip(self._records, self._ends, strict=True)
        counts = [record.counts(end) for record, end in ends if end is not None]
        prompt = counts[0].prompt if self._prompt_tokens is None else self._prompt_tokens
        return Usage.of(TokenCounts.summed(counts, prompt))


def _call_deltas(deltas: tuple[CallDelta, ...]) -> list[ToolCallDelta]:
    """A choice's tool calls as they are written: a call's start, more arguments; one entry
    per call in a chunk, as OpenAI's."""
    calls: list[ToolCallDelta] = []
    for delta in deltas:
        if delta.name:
            calls.append(ToolCallDelta.start(delta.index, delta.id, delta.name))
        elif calls and calls[-1].index == delta.index:
            calls[-1].function.arguments += delta.arguments
        else:
            calls.append(ToolCallDelta.more(delta.index, delta.arguments))
    return calls


def _error_event(error: ApiError) -> bytes:
    # The openai client raises an APIError for an event whose data holds "error".
    return sse_event(error.openai_body())
