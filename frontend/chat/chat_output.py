"""The neutral reply of every surface that speaks in conversations (chat completions,
Anthropic's Messages, OpenAI's Responses): a chat reply's thinking, text and tool calls as
they come (``ChatOutput``; the text held back while it may still be a tool call, a call's
name and arguments as they are written), then at the end its last text, its tool calls and
its finish reason; a whole reply read the same way (``whole_ending``); and the order of a
streamed reply's events (``ChatEvents``), which Messages and Responses fill in with their
own (chat completions, whose stream carries several choices, reads ``ChatOutput`` per
choice)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable

from tinyserve.frontend.chat.ending import finish_reason, reply_error
from tinyserve.frontend.link.board_view import NodeLoad
from tinyserve.frontend.link.streams import text_of
from tinyserve.frontend.models.errors import ApiError, internal_error
from tinyserve.frontend.models.progress import PromptProgress
from tinyserve.frontend.request.record import RequestRecord
from tinyserve.frontend.request.sse import progress_of
from tinyserve.frontend.structured.reply_parser import CallDelta, ParsedReply, Parts, ReplyParser
from tinyserve.protocol import RequestUpdate


class ChatOutput:
    """One reply's thinking and text, read by ``parser`` (its reasoning tags, its tool calls
    in the model's syntax)."""

    def __init__(self, parser: ReplyParser) -> None:
        self._stream = parser.stream()
        self.reasoning = ""  # the reply's thinking so far, as sent
        self.text = ""  # the reply's text so far, as sent
        self.started = 0  # tool calls whose start went out as they were written

    def feed(self, text: str) -> Parts:
        """What of ``text`` may be sent now."""
        parts = self._stream.feed(text)
        self.reasoning += parts.reasoning
        self.text += parts.content
        self.started += sum(1 for delta in parts.calls if delta.name)
        return parts

    def end(self, end: RequestUpdate) -> ParsedReply:
        """The end, once ``end`` came (a normal one: errors go another way): thinking and
        text not sent yet, the tool calls, the finish reason."""
        parsed = self._stream.end(finish_reason(end))
        self.reasoning += parsed.reasoning
        self.text += parsed.content
        return parsed


def whole_ending(whole: RequestUpdate, parser: ReplyParser) -> ParsedReply:
    """A whole reply's ending, read by ``parser``: all its thinking, text and tool calls
    (an ending that is not an error: the pipeline raised those)."""
    return parser.parse(text_of(whole), finish_reason(whole))


class ChatEvents(ABC):
    """The events of a streamed reply (``sse.Events``): its opening, then per update its
    progress (when asked) and its text as it may go out, then its one ending, or a
    failure's after a bug of ours."""

    def __init__(
        self, parser: ReplyParser, record: RequestRecord, load: Callable[[], NodeLoad | None]
    ) -> None:
        self.record = record
        self.load = load
        self.output = ChatOutput(parser)
        self.ended = False  # the ending went out

    async def take(self, update: RequestUpdate) -> list[bytes]:
        events = []
        progress = progress_of(self.record, update)
        if progress is not None:
            events.append(self.progress(progress))
        parts = self.output.feed(text_of(update))
        events += self.thinking(parts.reasoning)
        events += self.text(parts.content)
        events += self.calls(parts.calls)
        if update.finish_reason is not None:
            error = reply_error(update, self.load())
            events += [self.failure(error)] if error is not None else await self.end(update)
            self.ended = True
        return events

    def failure_events(self) -> list[bytes]:
        return [] if self.ended else [self.failure(internal_error())]

    @abstractmethod
    def failure(self, error: ApiError) -> bytes:
        """The ending of a stream that failed."""

    @abstractmethod
    def opening(self) -> list[bytes]:
        """What a stream starts with."""

    @abstractmethod
    def progress(self, progress: PromptProgress) -> bytes:
        """The prompt's prefill so far."""

    @abstractmethod
    def thinking(self, text: str) -> list[bytes]:
        """New thinking (none: nothing)."""

    @abstractmethod
    def text(self, text: str) -> list[bytes]:
        """New text (none: nothing)."""

    @abstractmethod
    def calls(self, deltas: tuple[CallDelta, ...]) -> list[bytes]:
        """Tool calls as they are written: a call's start, more of its arguments."""

    @abstractmethod
    async def end(self, end: RequestUpdate) -> list[bytes]:
        """The ending of a reply that ended normally: the last thinking and text, tool calls
        and the reply's end."""
