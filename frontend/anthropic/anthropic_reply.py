"""Replies of ``POST /v1/messages``.

JSON: an ``AnthropicMessage``. SSE, each event named by its type (Anthropic's stream):
``message_start``; per content block ``content_block_start``, its ``content_block_delta``s
and ``content_block_stop`` (the model's thinking as it comes, in a thinking block closed by a
``signature_delta``; text as it comes; a tool use once its name is written, its input in
``input_json_delta``s as it is written); then ``message_delta`` (stop reason, usage) and
``message_stop``. A
``ping`` is sent whenever the stream has been quiet for ``--sse-ping-interval`` (a long
prefill), and with ``return_progress`` ``prompt_progress`` events report the prefill. A
failure after the headers went out ends the stream with an ``error`` event instead of
``message_delta`` and ``message_stop``: exactly one of the two endings goes out.

Stop reasons: ``tool_use`` for tool calls, ``max_tokens`` for output cut short by its
length, ``pause_turn`` for output cut short by a timeout, a missed deadline or a cancel (the
turn stopped before its end; the client may send it back to go on), ``stop_sequence`` with the
one of ``stop_sequences`` the engine matched where the text stops, else ``end_turn``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Literal

from aiohttp import web
from pydantic import BaseModel

from tinyserve import protocol
from tinyserve.frontend.anthropic.anthropic_replies import (
    AnthropicMessage,
    AnthropicUsage,
    ContentBlock,
    ContentBlockDelta,
    ContentBlockStart,
    ContentBlockStop,
    InputJsonDelta,
    MessageDelta,
    MessagesProgress,
    MessageStart,
    MessageStop,
    Ping,
    SignatureDelta,
    StopInfo,
    StopReason,
    TextContent,
    TextDelta,
    ThinkingContent,
    ThinkingDelta,
    ToolUseContent,
)
from tinyserve.frontend.chat.chat_output import ChatEvents, whole_ending
from tinyserve.frontend.link.board_view import NodeLoad
from tinyserve.frontend.models.chat import FinishReason
from tinyserve.frontend.models.common import json_response
from tinyserve.frontend.models.errors import ApiError
from tinyserve.frontend.models.progress import PromptProgress
from tinyserve.frontend.models.tools import ToolCall
from tinyserve.frontend.request.record import RequestRecord
from tinyserve.frontend.request.sse import Events, sse_event
from tinyserve.frontend.structured.reply_parser import CallDelta, ParsedReply, ReplyParser
from tinyserve.protocol import RequestUpdate

ID_PREFIX = "msg_"
# Endings that stop a turn before its end for a reason other than its length: Anthropic's
# pause_turn (the turn may be sent back to go on), never max_tokens.
PAUSED = frozenset({protocol.FINISH_TIMEOUT, protocol.FINISH_DEADLINE_MISSED,
                    protocol.FINISH_CANCELLED})  # fmt: skip
BlockKind = Literal["thinking", "text", "tool_use"]
PING = sse_event(Ping(), "ping")


def event(body: BaseModel) -> bytes:
    """An event of the stream, named by its ``type`` as Anthropic's are."""
    return sse_event(body, type(body).model_fields["type"].default)


class AnthropicReply:
    """The ``Reply`` of one ``/v1/messages`` request (see ``pipeline.run``); ``parser``
    reads its text and tool uses in the model's own syntax."""

    def __init__(self, model: str, parser: ReplyParser) -> None:
        self.model = model
        self.parser = parser

    keepalive = PING
    queue_timeout_refused = True

    def events(self, record: RequestRecord, load: Callable[[], NodeLoad | None]) -> Events:
        return _MessageEvents(self, record, load)

    async def whole(self, record: RequestRecord, whole: RequestUpdate) -> web.Response:
        ending = whole_ending(whole, self.parser)
        thinking = [ThinkingContent(thinking=ending.reasoning, signature=record.request_id)]
        content = [
            *(thinking if ending.reasoning else []),
            *_text_blocks(ending.content, ending.calls),
            *map(_tool_use, ending.calls),
        ]
        stop = self.stop(whole, ending.reason)
        body = self.message(record, content, stop, AnthropicUsage.of(record.counts(whole)))
        return json_response(body, headers={"X-Request-Id": record.request_id})

    def message(
        self,
        record: RequestRecord,
        content: list[ContentBlock],
        stop: tuple[StopReason, str | None] | None,
        usage: AnthropicUsage,
    ) -> AnthropicMessage:
        """The reply, or with no content nor ``stop`` a stream's opening."""
        reason, sequence = stop if stop is not None else (None, None)
        return AnthropicMessage(
            id=ID_PREFIX + record.request_id, model=self.model, content=content,
            stop_reason=reason, stop_sequence=sequence, usage=usage,
        )  # fmt: skip

    def stop(self, end: RequestUpdate, reason: FinishReason) -> tuple[StopReason, str | None]:
        """The stop reason (``end`` the engine's last word, ``reason`` the reply's), and the
        stop sequence that ended the reply if one did (the engine says which it matched)."""
        if end.finish_reason in PAUSED:
            return "pause_turn", None
        if reason != "stop":
            return ("tool_use" if reason == "tool_calls" else "max_tokens"), None
        if end.stop_string:
            return "stop_sequence", end.stop_string
        return "end_turn", None


def _text_blocks(text: str, calls: list[ToolCall]) -> list[ContentBlock]:
    # A reply of tool uses only has no text block; any other reply has one, even empty.
    return [TextContent(text=text)] if text or not calls else []


def _tool_use(call: ToolCall, arguments: dict[str, Any] | None = None) -> ToolUseContent:
    """The tool use of ``call``, with ``arguments`` as its input (its own by default)."""
    if arguments is None:
        parsed = json.loads(call.function.arguments)
        arguments = parsed if isinstance(parsed, dict) else {"input": parsed}
    return ToolUseContent(id=call.id, name=call.function.name, input=arguments)


class _MessageEvents(ChatEvents):
    """The events of a streamed reply: blocks as the thinking and the text come, tool uses
    at the end."""

    def __init__(
        self, reply: AnthropicReply, record: RequestRecord, load: Callable[[], NodeLoad | None]
    ) -> None:
        super().__init__(reply.parser, record, load)
        self._reply = reply
        self._blocks = 0  # content blocks started
        self._texts = 0  # text blocks started
        self._open: BlockKind | None = None  # the kind of the last block, while not stopped

    def opening(self) -> list[bytes]:
        usage = AnthropicUsage.of(self.record.counts())
        return [event(MessageStart(message=self._reply.message(self.record, [], None, usage)))]

    def progress(self, progress: PromptProgress) -> bytes:
        return event(MessagesProgress(prompt_progress=progress))

    def failure(self, error: ApiError) -> bytes:
        error.request_id = self.record.request_id
        return event(error.anthropic_body())

    def thinking(self, text: str) -> list[bytes]:
        """A thinking delta, in a thinking block (started when none is open)."""
        return self._in_block("thinking", ThinkingDelta(thinking=text)) if text else []

    def text(self, text: str) -> list[bytes]:
        """A text delta, in a text block (started when none is open)."""
        return self._in_block("text", TextDelta(text=text)) if text else []

    def _in_block(self, kind: BlockKind, delta: ThinkingDelta | TextDelta) -> list[bytes]:
        events = self._open_block(kind)
        return [*events, event(ContentBlockDelta(index=self._blocks - 1, delta=delta))]

    def calls(self, deltas: tuple[CallDelta, ...]) -> list[bytes]:
        """A tool use's start once its name is written, then its input as it comes."""
        events: list[bytes] = []
        for delta in deltas:
            if delta.name:
                events += self._stop()
                events.append(self._start(ToolUseContent(id=delta.id, name=delta.name, input={})))
                self._open = "tool_use"
            else:
                more = InputJsonDelta(partial_json=delta.arguments)
                events.append(event(ContentBlockDelta(index=self._blocks - 1, delta=more)))
        return events

    def _open_block(self, kind: BlockKind) -> list[bytes]:
        """The events that make a block of ``kind`` the open one (none when it is)."""
        if self._open == kind:
            return []
        events = self._stop()
        empty: ContentBlock = (
            TextContent(text="") if kind == "text" else ThinkingContent(thinking="", signature="")
        )
        self._texts += kind == "text"
        self._open = kind
        return [*events, self._start(empty)]

    def _start(self, block: ContentBlock) -> bytes:
        self._blocks += 1
        return event(ContentBlockStart(index=self._blocks - 1, content_block=block))

    def _stop(self) -> list[bytes]:
        """The end of the open block, if one is: a thinking block's signature first."""
        if self._open is None:
            return []
        index, events = self._blocks - 1, []
        if self._open == "thinking":
            signature = SignatureDelta(signature=self.record.request_id)
            events.append(event(ContentBlockDelta(index=index, delta=signature)))
        self._open = None
        return [*events, event(ContentBlockStop(index=index))]

    async def end(self, end: RequestUpdate, ending: ParsedReply) -> list[bytes]:
        events = [*self.thinking(ending.reasoning), *self.text(ending.content)]
        streamed = self.output.started
        if not self._texts and not ending.calls and not streamed:
            events += self._open_block("text")  # a reply has a text block, even empty
        events += self._stop()
        for call in ending.calls[streamed:]:  # those not streamed: whole
            events.append(self._start(_tool_use(call, {})))
            delta = InputJsonDelta(partial_json=call.function.arguments)
            events.append(event(ContentBlockDelta(index=self._blocks - 1, delta=delta)))
            events.append(event(ContentBlockStop(index=self._blocks - 1)))
        reason, sequence = self._reply.stop(end, ending.reason)
        usage = AnthropicUsage.of(self.record.counts(end))
        stop = StopInfo(stop_reason=reason, stop_sequence=sequence)
        return [*events, event(MessageDelta(delta=stop, usage=usage)), event(MessageStop())]
