"""OpenAI-format replies (completions and chat): the ``Reply`` of one request, and a whole
reply's JSON (``Completion`` / ``ChatCompletion``, ``openai_replies``); a stream's
chunks are ``openai_stream``'s. Finish reasons and errors are the chat path's
(``chat.ending``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from tinyserve.frontend.chat.chat_output import whole_ending
from tinyserve.frontend.chat.ending import finish_reason, reply_error
from tinyserve.frontend.chat.logprobs import TokenLogprob
from tinyserve.frontend.link.board_view import NodeLoad
from tinyserve.frontend.link.streams import RequestStream, text_of
from tinyserve.frontend.models.common import json_response
from tinyserve.frontend.openai.openai_logprobs import (
    chat_logprobs,
    completion_logprobs,
    echo_logprobs,
)
from tinyserve.frontend.openai.openai_replies import (
    AssistantMessage,
    ChatChoice,
    ChatCompletion,
    Completion,
    CompletionChoice,
    Usage,
)
from tinyserve.frontend.openai.openai_stream import OpenAIFormat, StreamEvents
from tinyserve.frontend.request.record import RequestRecord
from tinyserve.frontend.request.sse import KEEPALIVE, Events, collect
from tinyserve.frontend.structured.reply_parser import ParsedReply
from tinyserve.protocol import RequestUpdate

WholeChoice = CompletionChoice | ChatChoice


@dataclass(frozen=True)
class Echo:
    """What ``echo`` puts before a completion: the prompt's text, and with logprobs its first
    token (which has none) and the logprobs of the others."""

    text: str
    first_token: bytes = b""
    tokens: tuple[TokenLogprob, ...] = ()


async def collect_or_error(
    stream: RequestStream, record: RequestRecord, load: NodeLoad | None
) -> RequestUpdate | web.Response:
    """The whole output of ``stream``, or the error reply its ending maps to."""
    whole = await collect(stream)
    error = reply_error(whole, load)
    if error is None:
        return whole
    error.request_id = record.request_id
    return error.response("openai")


class OpenAIReply(OpenAIFormat):
    """The ``Reply`` of one OpenAI request (see ``pipeline.run``)."""

    keepalive = KEEPALIVE
    queue_timeout_refused = True

    def events(self, record: RequestRecord, load: Callable[[], NodeLoad | None]) -> Events:
        return StreamEvents(self, [record], load)

    async def whole(self, record: RequestRecord, whole: RequestUpdate) -> web.Response:
        total = Usage.of(record.counts(whole))
        choice = await self.choice(0, whole)
        return self.respond(record, [choice], total, {"X-Request-Id": record.request_id})

    async def choice(
        self, index: int, whole: RequestUpdate, echo: Echo | None = None
    ) -> WholeChoice:
        """The choice at ``index`` of a whole reply; a chat reply's text is read by the
        request's ``parser`` (thinking, text and tool calls)."""
        tokens = await self.logprobs_of(whole.token_ids, whole.logprobs)
        if self.surface.chat:
            ending = whole_ending(whole, self.parser)
            logprobs = None if tokens is None else chat_logprobs(tokens)
            return ChatChoice(
                index=index,
                message=_message(ending),
                logprobs=logprobs,
                finish_reason=ending.reason,
            )
        reason, text = finish_reason(whole), text_of(whole)
        text_logprobs = None if tokens is None else completion_logprobs(tokens, 0)
        if echo is not None:
            text = echo.text + text
            if tokens is not None:
                text_logprobs = echo_logprobs(echo.first_token, echo.tokens, tokens)
        return CompletionChoice(
            index=index, text=text, logprobs=text_logprobs, finish_reason=reason
        )

    def respond(
        self, record: RequestRecord, choices: list[Any], total: Usage, headers: dict[str, str]
    ) -> web.Response:
        """The whole reply: ``choices`` (the surface's ``WholeChoice``) in the envelope of
        ``record`` (the first choice's)."""
        body = ChatCompletion if self.surface.chat else Completion
        reply = body(**self.envelope(record), choices=choices, usage=total)
        return json_response(reply, headers=headers)


def _message(ending: ParsedReply) -> AssistantMessage:
    """A whole reply's message: no content when it is only tool calls."""
    return AssistantMessage(
        content=ending.content if ending.content or not ending.calls else None,
        reasoning_content=ending.reasoning or None,
        tool_calls=ending.calls or None,
    )
