"""Replies of ``POST /v1/responses``.

JSON: a ``Response``. SSE, each event named by its type and numbered (``sequence_number``):
``response.created`` and ``response.in_progress``; for the model's thinking, a reasoning
item (``output_item.added``, ``reasoning_text.delta``s as it comes, ``reasoning_text.done``,
``output_item.done``); for the message, ``output_item.added``, ``content_part.added``,
``output_text.delta``s as the text comes, ``output_text.done``, ``content_part.done``,
``output_item.done``; for each function call, ``output_item.added`` once its name is
written, its arguments in ``function_call_arguments.delta``s as they are written, ``.done``
and ``output_item.done``; then exactly one of ``response.completed``,
``response.incomplete`` (``max_output_tokens`` reached) and ``response.failed`` (an error
after the stream began). Keep-alive comments fill silences (``--sse-ping-interval``); with
``return_progress``, ``response.prompt_progress`` events report the prefill.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web

from tinyserve.frontend.chat.chat_output import ChatEvents, whole_ending
from tinyserve.frontend.link.board_view import NodeLoad
from tinyserve.frontend.models.common import json_response
from tinyserve.frontend.models.errors import ApiError
from tinyserve.frontend.models.progress import PromptProgress
from tinyserve.frontend.models.tools import ToolCall
from tinyserve.frontend.request.generation import Generation
from tinyserve.frontend.request.record import RequestRecord
from tinyserve.frontend.request.sse import KEEPALIVE, Events, sse_event
from tinyserve.frontend.responses.responses_replies import (
    ArgumentsDelta,
    ArgumentsDone,
    ContentPartEvent,
    EchoedTool,
    FunctionToolCall,
    IncompleteDetails,
    ItemStatus,
    Lifecycle,
    OutputItem,
    OutputItemEvent,
    OutputMessage,
    OutputTextContent,
    OutputTextDelta,
    OutputTextDone,
    ReasoningItem,
    ReasoningText,
    ReasoningTextDelta,
    ReasoningTextDone,
    Response,
    ResponseError,
    ResponsesProgress,
    ResponseStatus,
    ResponsesUsage,
)
from tinyserve.frontend.responses.responses_requests import FunctionChoice, ResponsesRequest
from tinyserve.frontend.structured.reply_parser import CallDelta, ParsedReply, ReplyParser
from tinyserve.protocol import RequestUpdate

ID_PREFIX, MESSAGE_PREFIX, CALL_PREFIX, REASONING_PREFIX = "resp_", "msg_", "fc_", "rs_"


class ResponsesReply:
    """The ``Reply`` of one ``/v1/responses`` request (see ``pipeline.run``); ``parser``
    reads its text and function calls in the model's own syntax."""

    def __init__(
        self, req: ResponsesRequest, model: str, generation: Generation, parser: ReplyParser
    ) -> None:
        self.parser = parser
        self.created = int(time.time())
        self._fields = _echoed(req, model, generation)  # what every Response repeats of the request

    keepalive = KEEPALIVE
    queue_timeout_refused = True

    def events(self, record: RequestRecord, load: Callable[[], NodeLoad | None]) -> Events:
        return _ResponseEvents(self, record, load)

    async def whole(self, record: RequestRecord, whole: RequestUpdate) -> web.Response:
        ending = whole_ending(whole, self.parser)
        status = _status(ending)
        items: list[OutputItem] = []
        if ending.reasoning:
            items.append(reasoning(record, ending.reasoning))
        if ending.content or not ending.calls:
            items.append(message(record, ending.content, status))
        items += [_whole(call) for call in ending.calls]
        body = self.response(record, status, items, ResponsesUsage.of(record.counts(whole)))
        return json_response(body, headers={"X-Request-Id": record.request_id})

    def response(
        self,
        record: RequestRecord,
        status: ResponseStatus,
        output: list[OutputItem],
        usage: ResponsesUsage | None = None,
        error: ApiError | None = None,
    ) -> Response:
        """The response as it stands."""
        failure = None
        if error is not None:
            failure = ResponseError(code="server_error", message=error.message,
                                    type=error.reason or error.type)  # fmt: skip
        incomplete = (
            IncompleteDetails(reason="max_output_tokens") if status == "incomplete" else None
        )
        return Response(
            id=ID_PREFIX + record.request_id, created_at=self.created, status=status,
            output=output, usage=usage, error=failure, incomplete_details=incomplete,
            **self._fields,
        )  # fmt: skip


def _echoed(req: ResponsesRequest, model: str, generation: Generation) -> dict[str, Any]:
    """The request's fields a Response repeats, with the defaults it ran with."""
    choice: Any = req.tool_choice or "auto"
    if isinstance(choice, FunctionChoice):
        choice = choice.model_dump()
    text_format = {"type": "text"}
    if req.text is not None and req.text.format is not None:
        text_format = req.text.format.model_dump(by_alias=True, exclude_none=True)
    tools = [
        EchoedTool(name=t.name, description=t.description, parameters=t.parameters, strict=True)
        for t in req.function_tools
    ]
    return {
        "model": model, "instructions": req.instructions,
        "max_output_tokens": generation.max_tokens, "parallel_tool_calls": req.parallel_tool_calls,
        "temperature": generation.sampling.temperature, "top_p": generation.sampling.top_p,
        "tool_choice": choice, "tools": tools, "text": {"format": text_format},
    }  # fmt: skip


def message(record: RequestRecord, text: str | None, status: ResponseStatus) -> OutputMessage:
    """The message item: with ``text`` None, as it starts (no content yet)."""
    if text is None:
        return OutputMessage(
            id=MESSAGE_PREFIX + record.request_id, status="in_progress", content=[]
        )
    done: ItemStatus = "incomplete" if status == "incomplete" else "completed"
    content = [OutputTextContent(text=text)]
    return OutputMessage(id=MESSAGE_PREFIX + record.request_id, status=done, content=content)


def reasoning(record: RequestRecord, text: str | None) -> ReasoningItem:
    """The reasoning item: with ``text`` None, as it starts (no content yet)."""
    item_id = REASONING_PREFIX + record.request_id
    if text is None:
        return ReasoningItem(id=item_id, status="in_progress", content=[])
    return ReasoningItem(id=item_id, status="completed", content=[ReasoningText(text=text)])


def function_call(call_id: str, name: str, arguments: str, status: Any) -> FunctionToolCall:
    """The function call item of the call ``call_id`` (as it starts, or as far as it got)."""
    return FunctionToolCall(
        id=_item_id(call_id), call_id=call_id, name=name, arguments=arguments, status=status
    )


def _item_id(call_id: str) -> str:
    return CALL_PREFIX + call_id.removeprefix("call_")


def _whole(call: ToolCall) -> FunctionToolCall:
    return function_call(call.id, call.function.name, call.function.arguments, "completed")


def _normal(arguments: str) -> str:
    """Arguments as the reply's calls write them (``tool_calls.parse_calls``)."""
    try:
        return json.dumps(json.loads(arguments), ensure_ascii=False)
    except ValueError:
        return arguments


def _status(ending: ParsedReply) -> ResponseStatus:
    return "incomplete" if ending.reason == "length" else "completed"


class _ResponseEvents(ChatEvents):
    """The events of a streamed response: the message's text as it comes, function calls
    at the end, each event numbered."""

    def __init__(
        self, reply: ResponsesReply, record: RequestRecord, load: Callable[[], NodeLoad | None]
    ) -> None:
        super().__init__(reply.parser, record, load)
        self._reply = reply
        self._sequence = 0
        self._items: list[OutputItem] = []  # done
        self._reasoning_open = False  # the reasoning item started and is not done
        self._message_open = False  # the message item started and is not done
        self._call: tuple[CallDelta, str] | None = None  # the call streaming: start, arguments

    def _event(self, kind: type[Any], **fields: Any) -> bytes:
        body = kind(sequence_number=self._sequence, **fields)
        self._sequence += 1
        return sse_event(body, body.type)

    def _lifecycle(self, kind: str, status: ResponseStatus, **fields: Any) -> bytes:
        response = self._reply.response(self.record, status, list(self._items), **fields)
        return self._event(Lifecycle, type=kind, response=response)

    def opening(self) -> list[bytes]:
        return [self._lifecycle(kind, "in_progress")
                for kind in ("response.created", "response.in_progress")]  # fmt: skip

    def progress(self, progress: PromptProgress) -> bytes:
        return self._event(ResponsesProgress, prompt_progress=progress)

    def failure(self, error: ApiError) -> bytes:
        return self._lifecycle("response.failed", "failed", error=error)

    def _index(self) -> int:
        return len(self._items)

    def thinking(self, text: str) -> list[bytes]:
        """A reasoning text delta, after the reasoning item's start when it has not
        started."""
        if not text:
            return []
        events = [] if self._reasoning_open else self._open_reasoning()
        where = {"item_id": REASONING_PREFIX + self.record.request_id,
                 "output_index": self._index(), "content_index": 0}  # fmt: skip
        return [*events, self._event(ReasoningTextDelta, delta=text, **where)]

    def _open_reasoning(self) -> list[bytes]:
        self._reasoning_open = True
        item = reasoning(self.record, None)
        return [self._event(OutputItemEvent, type="response.output_item.added",
                            output_index=self._index(), item=item)]  # fmt: skip

    def _close_reasoning(self) -> list[bytes]:
        if not self._reasoning_open:
            return []
        item = reasoning(self.record, self.output.reasoning)
        where = {"item_id": item.id, "output_index": self._index(), "content_index": 0}
        events = [
            self._event(ReasoningTextDone, text=self.output.reasoning, **where),
            self._event(OutputItemEvent, type="response.output_item.done",
                        output_index=self._index(), item=item),
        ]  # fmt: skip
        self._items.append(item)
        self._reasoning_open = False
        return events

    def text(self, text: str) -> list[bytes]:
        """A text delta, after the message item's start when it has not started (and the
        reasoning's end, when it was open)."""
        if not text:
            return []
        events = self._close_reasoning()
        events += [] if self._message_open else self._open_message()
        item_id = MESSAGE_PREFIX + self.record.request_id
        where = {"item_id": item_id, "output_index": self._index(), "content_index": 0}
        return [*events, self._event(OutputTextDelta, delta=text, **where)]

    def calls(self, deltas: tuple[CallDelta, ...]) -> list[bytes]:
        """A function call's item once its name is written, then its arguments as they come
        (the items before it done first)."""
        events: list[bytes] = []
        for delta in deltas:
            if delta.name:
                events += self._close_reasoning() + self._close_message("completed")
                events += self._close_call(None)
                added = function_call(delta.id, delta.name, "", "in_progress")
                events.append(self._event(OutputItemEvent, type="response.output_item.added",
                                          output_index=self._index(), item=added))  # fmt: skip
                self._call = (delta, "")
            elif self._call is not None:
                start, arguments = self._call
                self._call = (start, arguments + delta.arguments)
                where = {"item_id": _item_id(start.id), "output_index": self._index()}
                events.append(self._event(ArgumentsDelta, delta=delta.arguments, **where))
        return events

    def _close_call(self, call: ToolCall | None) -> list[bytes]:
        """The end of the call streaming, if one is, with ``call``'s arguments (the reply's
        own, at its end) or those it streamed."""
        if self._call is None:
            return []
        start, arguments = self._call
        done = (
            _whole(call)
            if call is not None
            else function_call(start.id, start.name, _normal(arguments), "completed")
        )
        where = {"item_id": done.id, "output_index": self._index()}
        events = [
            self._event(ArgumentsDone, name=done.name, arguments=done.arguments, **where),
            self._event(OutputItemEvent, type="response.output_item.done",
                        output_index=self._index(), item=done),
        ]  # fmt: skip
        self._items.append(done)
        self._call = None
        return events

    def _open_message(self) -> list[bytes]:
        self._message_open = True
        item = message(self.record, None, "in_progress")
        where = {"item_id": item.id, "output_index": self._index(), "content_index": 0}
        added = self._event(OutputItemEvent, type="response.output_item.added",
                            output_index=self._index(), item=item)  # fmt: skip
        part = self._event(ContentPartEvent, type="response.content_part.added",
                           part=OutputTextContent(text=""), **where)  # fmt: skip
        return [added, part]

    def _close_message(self, status: ResponseStatus) -> list[bytes]:
        if not self._message_open:
            return []
        text = self.output.content
        item = message(self.record, text, status)
        where = {"item_id": item.id, "output_index": self._index(), "content_index": 0}
        events = [
            self._event(OutputTextDone, text=text, **where),
            self._event(ContentPartEvent, type="response.content_part.done",
                        part=OutputTextContent(text=text), **where),
            self._event(OutputItemEvent, type="response.output_item.done",
                        output_index=self._index(), item=item),
        ]  # fmt: skip
        self._items.append(item)
        self._message_open = False
        return events

    def _whole_call(self, index: int, call: ToolCall) -> list[bytes]:
        """A call that did not stream, the reply's ``index``-th: its start and its arguments
        in one delta, then its end as a streamed call's."""
        start = CallDelta(index, call.id, call.function.name)
        events = self.calls((start, CallDelta(start.index, arguments=call.function.arguments)))
        return events + self._close_call(call)

    async def end(self, end: RequestUpdate, ending: ParsedReply) -> list[bytes]:
        status = _status(ending)
        events = [*self.thinking(ending.reasoning), *self.text(ending.content)]
        events += self._close_reasoning()
        streamed = self.output.started
        if self._message_open or not (ending.calls or streamed):
            events += [] if self._message_open else self._open_message()
            events += self._close_message(status)
        last = ending.calls[streamed - 1] if 0 < streamed <= len(ending.calls) else None
        events += self._close_call(last)
        for index, call in enumerate(ending.calls[streamed:], streamed):  # not streamed: whole
            events += self._whole_call(index, call)
        usage = ResponsesUsage.of(self.record.counts(end))
        kind = "response.incomplete" if status == "incomplete" else "response.completed"
        return [*events, self._lifecycle(kind, status, usage=usage)]
