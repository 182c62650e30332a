"""For the surfaces that answer in other shapes what the chat surface generates (Anthropic's
Messages, OpenAI's Responses): a chat reply's text as it comes (``ChatOutput``), held back
while it may still be a tool call, then at the end its last text, its tool calls and its
finish reason, decided as a chat completion decides them; and the order of a streamed
reply's events (``ChatEvents``), which each surface fills in with its own."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator
from dataclasses import dataclass

from tinyserve.frontend.http.api_errors import ApiError
from tinyserve.frontend.models.openai_reply_bodies import FinishReason, ToolCall
from tinyserve.frontend.models.progress import PromptProgress
from tinyserve.frontend.openai.openai_reply import (
    FINISH_REASONS,
    internal_error,
    openai_finish_error,
)
from tinyserve.frontend.request.record import RequestRecord
from tinyserve.frontend.request.reply_common import LoadNow, Output, collect, progress_of
from tinyserve.frontend.request.streams import Finish, RequestStream
from tinyserve.frontend.structured.reply_parser import ReplyParser


@dataclass(frozen=True)
class Ending:
    """How a reply ends: text not sent yet, the tool calls it made, why it ended."""

    text: str
    calls: list[ToolCall]
    reason: FinishReason


class ChatOutput:
    """One reply's text, read by ``parser`` (its tool calls in the model's syntax); a parser
    without reasoning tags: these surfaces send thinking as text."""

    def __init__(self, parser: ReplyParser) -> None:
        self._stream = parser.stream()
        self.text = ""  # the reply's text so far, as sent

    def feed(self, text: str) -> str:
        """What of ``text`` may be sent now."""
        text = self._stream.feed(text).content
        self.text += text
        return text

    def end(self, finish: Finish) -> Ending:
        """The end, once ``finish`` came (a normal one: errors go another way)."""
        parsed = self._stream.end(FINISH_REASONS.get(finish.reason, "stop"))
        self.text += parsed.content
        return Ending(parsed.content, parsed.calls, parsed.reason)


async def collect_ending(
    stream: RequestStream, load: LoadNow, parser: ReplyParser
) -> tuple[Output, Ending]:
    """The whole output of ``stream`` and its ending (all its text, none sent); raises the
    error its finish maps to, which the error middleware answers in the path's shape."""
    output = await collect(stream)
    error = openai_finish_error(output.finish, load())
    if error is not None:
        raise error
    chat = ChatOutput(parser)
    text = chat.feed(output.text)
    ending = chat.end(output.finish)
    return output, Ending(text + ending.text, ending.calls, ending.reason)


class ChatEvents(ABC):
    """The events of a streamed reply: its opening, then per piece its progress (when asked)
    and its text as it may go out, then its one ending, or a failure's after a bug of ours
    (``reply_common.EventSource``)."""

    def __init__(
        self, parser: ReplyParser, stream: RequestStream, record: RequestRecord, load: LoadNow
    ) -> None:
        self.stream = stream
        self.record = record
        self.load = load
        self.output = ChatOutput(parser)
        self.tokens = 0
        self.token_ids: list[int] = []
        self._ended = False  # the ending went out

    async def events(self) -> AsyncGenerator[bytes, None]:
        for event in self.opening():
            yield event
        async for piece in self.stream.pieces():
            self.tokens += piece.tokens
            self.token_ids += piece.token_ids
            progress = progress_of(self.record, piece)
            if progress is not None:
                yield self.progress(progress)
            for event in self.text(self.output.feed(piece.text)):
                yield event
            if piece.finish is not None:
                for event in await self.end(piece.finish):
                    yield event
                self._ended = True  # resumed only once the ending was written

    def failure_events(self) -> list[bytes]:
        return [] if self._ended else [self.failure(internal_error())]

    @abstractmethod
    def opening(self) -> list[bytes]:
        """What a stream starts with."""

    @abstractmethod
    def progress(self, progress: PromptProgress) -> bytes:
        """The prompt's prefill so far."""

    @abstractmethod
    def text(self, text: str) -> list[bytes]:
        """New text (none: nothing)."""

    @abstractmethod
    async def end(self, finish: Finish) -> list[bytes]:
        """The ending: the last text, tool calls and the reply's end, or the failure that
        ``finish`` is."""

    @abstractmethod
    def failure(self, error: ApiError) -> bytes:
        """The ending of a stream that failed."""
