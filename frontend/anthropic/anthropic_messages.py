"""A Messages request's turns (``MessageParam``): text, or content blocks (text, an earlier
tool use, a tool's result, thinking), each checked against its role, and each turn as the
chat messages of the conversation the rest of the frontend serves."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal, Self

from pydantic import Field, Tag, model_validator

from tinyserve.frontend.models.common import (
    IGNORED,
    OTHER,
    Body,
    Ignored,
    IgnoredItem,
    Text,
    cross_field,
    open_by_type,
)
from tinyserve.frontend.models.conversation import ChatMessage
from tinyserve.frontend.models.tools import FunctionName
from tinyserve.frontend.models.translated import (
    LIST,
    TEXT,
    chat_message,
    tag,
    text_or_list,
    tool_call,
)


class TextBlock(Body):
    type: Literal["text"]
    text: Text
    cache_control: Any = Field(None, description="accepted; this server caches every prefix")
    citations: Annotated[Any, Ignored(([],))] = None


# A system block Claude Code puts first, new on every request (``cch=`` changes): it is meant
# for Anthropic's billing, says nothing to the model, and in front of the prompt it would cost
# the prefix cache every agent turn. Left out of the prompt.
BILLING_HEADER = "x-anthropic-billing-header:"

TextBlocks = Annotated[list[TextBlock], Field(min_length=1)]
TextOrBlocks = Annotated[
    Annotated[Text, Tag(TEXT)] | Annotated[TextBlocks, Tag(LIST)],
    text_or_list("a non-empty list of text blocks"),
]
# A tool's result: text, or blocks of which the text ones are read (an image, a document, a
# tool reference is ignored, and reported).
ResultBlock = Annotated[
    Annotated[TextBlock, Tag(tag("text"))] | Annotated[IgnoredItem, Tag(OTHER)],
    open_by_type("a content block with a 'type'", "text"),
]
ResultContent = Annotated[
    Annotated[Text, Tag(TEXT)] | Annotated[list[ResultBlock], Tag(LIST)],
    text_or_list("a list of content blocks"),
]


class ToolUseBlock(Body):
    """A tool call of an earlier assistant turn."""

    type: Literal["tool_use"]
    id: Text
    name: FunctionName
    input: dict[str, Any]
    cache_control: Any = Field(None, description=IGNORED)

    @model_validator(mode="after")
    def _input_is_unicode(self) -> Self:
        # The prompt gets the input as JSON text, which must encode as every Text does.
        try:
            self.arguments.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise cross_field("input", f"'input' is not valid Unicode: {exc.reason}") from None
        return self

    @property
    def arguments(self) -> str:
        """The input as JSON text, as the call's arguments."""
        return json.dumps(self.input, ensure_ascii=False)


class ToolResultBlock(Body):
    """A tool's result, in a user turn."""

    type: Literal["tool_result"]
    tool_use_id: Text
    content: ResultContent | None = Field(None, description="text (none: empty)")
    is_error: bool | None = Field(False, description="the model reads the result as an error")
    cache_control: Any = Field(None, description=IGNORED)

    @property
    def text(self) -> str:
        content = self.content or ""
        text = content if isinstance(content, str) else joined(content)
        return f"Error: {text}" if self.is_error else text


class ThinkingBlock(Body):
    """An assistant's thinking in an earlier turn: accepted, and left out of the prompt (chat
    templates render no thinking of turns before the last user message)."""

    type: Literal["thinking"]
    thinking: Text
    signature: Any = Field(None, description=IGNORED)


class RedactedThinkingBlock(Body):
    """Thinking another server encrypted: accepted, and left out of the prompt."""

    type: Literal["redacted_thinking"]
    data: Any = Field(None, description=IGNORED)


Block = Annotated[
    Annotated[TextBlock, Tag(tag("text"))]
    | Annotated[ToolUseBlock, Tag(tag("tool_use"))]
    | Annotated[ToolResultBlock, Tag(tag("tool_result"))]
    | Annotated[ThinkingBlock, Tag(tag("thinking"))]
    | Annotated[RedactedThinkingBlock, Tag(tag("redacted_thinking"))]
    | Annotated[IgnoredItem, Tag(OTHER)],
    open_by_type(
        "a content block with a 'type'",
        "text",
        "tool_use",
        "tool_result",
        "thinking",
        "redacted_thinking",
    ),
]
AnthropicContent = Annotated[
    Annotated[Text, Tag(TEXT)] | Annotated[list[Block], Field(min_length=1), Tag(LIST)],
    text_or_list("a non-empty list of content blocks"),
]


class MessageParam(Body):
    """A turn: text, or blocks (``tool_use`` from the assistant, ``tool_result`` from the
    user). A ``system`` turn (Claude Code sends them) is system text, which the conversation
    moves into the system prompt (``prompt.conversation``)."""

    role: Literal["user", "assistant", "system"]
    content: AnthropicContent

    @model_validator(mode="after")
    def _blocks_of_the_role(self) -> Self:
        wrong = "tool_result" if self.role == "assistant" else "tool_use"
        if not isinstance(self.content, str) and any(b.type == wrong for b in self.content):
            message = f"'content' of the {self.role}'s turn cannot hold a {wrong} block"
            raise cross_field("content", message)
        return self

    def chat_messages(self) -> list[ChatMessage]:
        """This turn as chat messages: a user turn's tool results are tool messages, in
        order; an assistant turn's tool uses are its tool calls."""
        if isinstance(self.content, str):
            return [chat_message(self.role, self.content)]
        if self.role == "assistant":
            return [_assistant_message(self.content)]
        messages: list[ChatMessage] = []
        for block in self.content:
            if isinstance(block, ToolResultBlock):
                messages.append(chat_message("tool", block.text, tool_call_id=block.tool_use_id))
            elif isinstance(block, TextBlock):
                if messages and messages[-1].role == self.role:
                    messages[-1] = chat_message(self.role, f"{messages[-1].text}\n{block.text}")
                else:
                    messages.append(chat_message(self.role, block.text))
        # A turn of ignored blocks only (an image) is still the turn, empty.
        return messages or [chat_message(self.role, "")]


def _assistant_message(blocks: list[Any]) -> ChatMessage:
    text = joined([b for b in blocks if isinstance(b, TextBlock)])
    calls = [tool_call(b.id, b.name, b.arguments) for b in blocks if isinstance(b, ToolUseBlock)]
    return chat_message("assistant", text or None, calls or None)


def joined(blocks: list[Any]) -> str:
    """The text blocks among ``blocks``, joined by newlines."""
    return "\n".join(block.text for block in blocks if isinstance(block, TextBlock))
