"""The neutral reply of every surface that speaks in conversations (chat completions,
Anthropic's Messages, OpenAI's Responses): a chat reply's thinking, text and tool calls as
they come, read by the request's ``ReplyStream`` (``structured.reply_parser``: the text held
back while it may still be a tool call, a call's name and arguments as they are written),
then at the end its last text, its tool calls and its finish reason; a whole reply read the
same way (``whole_ending``); and the order of a streamed reply's events (``ChatEvents``),
which Messages and Responses fill in with their own (chat completions, whose stream carries
several choices, reads a ``ReplyStream`` per choice)."""

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
from tinyserve.frontend.structured.reply_parser import CallDelta, ParsedReply, ReplyParser
from tinyserve.protocol import RequestUpdate


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
        self.output = parser.stream()  # what of the reply went out
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
            if error is not None:
                events.append(self.failure(error))
            else:
                events += await self.end(update, self.output.end(finish_reason(update)))
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
    async def end(self, end: RequestUpdate, ending: ParsedReply) -> list[bytes]:
        """The events of a reply that ended normally (``end``, read as ``ending``): its last
        thinking and text, its tool calls and its end."""
