"""A conversation as the chat path runs it, whichever surface it came in on: its messages
(``ChatMessage``), what the chat template renders (``Conversation``), and the model's turn
in it that a generating surface asks for (``Turn``). Each surface validates its own body once
and builds these from what it validated (``models.chat`` for chat completions and
``/tokenize``, with ``translated`` for the Messages and Responses requests); the chat path
reads them and nothing of the surface (``chat.chat_generation``, ``prompt.conversation``,
``structured.constraints``). The rules across a conversation's fields that no body's schema
states, every surface applies in its own validator (``check_tools``, ``check_grammar``).

Roles: system, user, assistant, tool, and ``developer`` (OpenAI's newer name for system)
taken as system. Content: a string, or a list of text parts joined by newlines; parts of other
types (images, audio, files) are ignored and reported. How messages, tools, tool calls and
tool results reach the chat template is ``prompt.conversation``'s.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, Self

from pydantic import ConfigDict, Discriminator, Field, Tag, model_validator
from pydantic.config import JsonDict

from tinyserve.frontend.models.common import (
    IGNORED,
    OTHER,
    RULE,
    Body,
    Ignored,
    IgnoredItem,
    Text,
    cross_field,
    open_by_type,
    schema_rule,
)
from tinyserve.frontend.models.fields import Sampling
from tinyserve.frontend.models.response_format import ResponseFormat
from tinyserve.frontend.models.tools import NamedToolChoice, Tool, ToolCallIn, ToolChoice


class TextPart(Body):
    type: Literal["text"]
    text: Text


def _content_kind(value: Any) -> str | None:
    return TEXT if isinstance(value, str) else PARTS if isinstance(value, list) else None


TEXT, PARTS = "(text)", "(parts)"  # branch tags: ``parse._path`` leaves them out
ContentPart = Annotated[
    Annotated[TextPart, Tag("(text)")] | Annotated[IgnoredItem, Tag(OTHER)],
    open_by_type("a content part with a 'type'", "text"),
]
TextParts = Annotated[list[ContentPart], Field(min_length=1)]
Content = Annotated[
    Annotated[Text, Tag(TEXT)] | Annotated[TextParts, Tag(PARTS)],
    Discriminator(
        _content_kind,
        custom_error_type=RULE,
        custom_error_message="must be a string or a non-empty list of content parts",
    ),
]
# Message fields of features we lack (clients echo them back, mostly as null or empty).
EmptyOnly = Annotated[Any, Ignored(("", [], {}))]
_MESSAGE_RULES: JsonDict = {
    "allOf": [
        {  # content, unless an assistant's
            "if": {"properties": {"role": {"const": "assistant"}}},
            "else": {"required": ["content"], "properties": {"content": {"not": {"type": "null"}}}},
        },
        schema_rule("role", {"const": "tool"}, {"tool_call_id": {"not": {"type": "null"}}}),
    ]
}


class ChatMessage(Body):
    """``content`` is required, except in an assistant message (null or absent: a turn that
    only called tools). ``developer`` is taken as ``system``; several text parts are joined
    by newlines."""

    model_config = ConfigDict(json_schema_extra=_MESSAGE_RULES)

    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: Content | None = None
    name: Text | None = None
    tool_calls: list[ToolCallIn] | None = Field(None, description="an assistant's tool calls")
    function_call: EmptyOnly = None
    tool_call_id: Text | None = Field(None, description="the call a tool message answers")
    refusal: EmptyOnly = None
    audio: EmptyOnly = None
    annotations: EmptyOnly = None
    # The openai client's parse() puts the content, parsed, beside it; a reply message sent
    # back as it came keeps it.
    parsed: Any = Field(None, description=IGNORED)

    @model_validator(mode="after")
    def _content_unless_assistant(self) -> Self:
        if self.content is None and self.role != "assistant":
            raise cross_field("content", "'content' is required unless the role is assistant")
        if self.role == "tool" and self.tool_call_id is None:
            raise cross_field("tool_call_id", "a tool message needs 'tool_call_id'")
        return self

    @property
    def text(self) -> str:
        """The content as one text: parts joined by newlines, none as empty."""
        content = self.content or ""
        if isinstance(content, str):
            return content
        return "\n".join(p.text for p in content if isinstance(p, TextPart))


@dataclass(frozen=True)
class Conversation:
    """What the chat template renders into a prompt: the messages, the tools offered and the
    choice among them, and how the prompt ends. All that ``/tokenize`` and Anthropic's token
    count need; a generating surface asks for a ``Turn`` in it."""

    messages: list[ChatMessage]
    tools: list[Tool] = field(default_factory=list)
    tool_choice: ToolChoice | None = None
    add_generation_prompt: bool = True  # the prompt ends with the assistant's header
    continue_final_message: bool = False  # the reply continues the final (assistant's) message

    @property
    def calls_tools(self) -> bool:
        """The reply may be tool calls: tools offered, and ``tool_choice`` not none."""
        return bool(self.tools) and self.tool_choice != "none"


@dataclass(frozen=True)
class Turn:
    """The model's turn in ``conversation``, as a generating surface asks for it: how to
    sample it (``sampling``: the body itself, whose ``model_fields_set`` says which fields the
    client left to the serve-side defaults), how long it may be, the logprobs to report, the
    tool calls and the format it may take, and the end user it is for."""

    conversation: Conversation
    sampling: Sampling
    max_tokens: int | None = None  # asked by the client (None: --default-max-tokens)
    logprobs: int = -1  # alternatives per token to report (-1: no logprobs)
    user: str = ""  # the end user: the scheduling tenant unless ``sampling`` names one
    parallel_tool_calls: bool = True
    response_format: ResponseFormat | None = None


def check_tools(names: list[str], choice: ToolChoice | None, grammar: str = "") -> None:
    """The rules across the tools offered (``names``: their functions'), the tool choice and
    a ``grammar`` that the document does not state, for every surface that offers tools: a
    400 in chat's words when a choice other than none has no tools, a function is named
    twice, a named choice is none of them, or a grammar would replace the tools' grammar of
    a choice other than auto."""
    if choice not in (None, "none") and not names:
        raise cross_field("tool_choice", "'tool_choice' needs 'tools'")
    if len(set(names)) != len(names):
        raise cross_field("tools", "'tools' names a function twice")
    if isinstance(choice, NamedToolChoice) and choice.function.name not in names:
        raise cross_field("tool_choice", f"no tool is named {choice.function.name!r}")
    if grammar and names and choice not in (None, "auto", "none"):
        message = "'grammar' replaces the tools' grammar of tool_choice auto only"
        raise cross_field("grammar", message)


def check_grammar(grammar: str, text_format: bool) -> None:
    """A ``grammar`` excludes a response format other than text (``text_format``: none, or
    text): a 400 in chat's words, on every surface that takes both."""
    if grammar and not text_format:
        raise cross_field("grammar", "'grammar' excludes a 'response_format' other than text")
