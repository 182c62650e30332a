"""``POST /v1/chat/completions``: the request body and its messages, the conversation that
every surface speaking in conversations is translated into (``translated``: the Messages and
Responses requests) and that ``prompt`` renders and ``structured`` constrains; with
``OpenAIRequest``, the fields it shares with ``/v1/completions``, and ``FinishReason``, why a
reply to it ended.

Every field of OpenAI's request schemas is one of: supported (declared with its type);
accepted silently (bookkeeping or hints for OpenAI's own service that cannot change the
output, declared ``Any`` and ``IGNORED``); a feature this server lacks, accepted, ignored and
reported (``Ignored``), or refused where the reply would not do without it (``OnlyDefault``);
anything else is unknown, and ignored and reported too. ``null`` means the default for every
known field. Extensions: ``priority``, ``tenant``, ``top_k``, ``ignore_eos``, ``grammar``
(as llama.cpp's server takes it; not with a ``response_format`` other than text), and for
chat ``add_generation_prompt`` / ``continue_final_message``.

Roles: system, user, assistant, tool, and ``developer`` (OpenAI's newer name for system)
taken as system. Content: a string, or a list of text parts joined by newlines; parts of other
types (images, audio, files) are ignored and reported. How messages, tools, tool calls and
tool results reach the chat template is ``prompt.conversation``'s.
"""

from __future__ import annotations

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
    Integer,
    OnlyDefault,
    Request,
    Text,
    cross_field,
    open_by_type,
    schema_rule,
)
from tinyserve.frontend.models.fields import (
    DEFAULT_TEMPERATURE,
    MAX_TOKENS_TEXT,
    LogprobCount,
    ModelId,
    OutputLength,
    Sampling,
    Temperature,
)
from tinyserve.frontend.models.response_format import ResponseFormat
from tinyserve.frontend.models.tools import NamedToolChoice, Tool, ToolCallIn, ToolChoice

# Why a reply ended, as the reply parser decides it for every surface that speaks in
# conversations (each says it in its own words): it stopped, its length cut it, it calls tools.
FinishReason = Literal["stop", "length", "tool_calls"]

# -- the fields both OpenAI generation requests take -----------------------------------------------

MAX_CHOICES = 16  # n, and prompts x n on /v1/completions
ChoiceCount = Annotated[int, Integer(1, MAX_CHOICES)]


class StreamOptions(Body):
    include_usage: bool | None = Field(None, description="end the stream with a usage chunk")
    include_obfuscation: bool | None = Field(None, description=IGNORED)


# As OpenAI does: stream_options only with a stream.
STREAM_RULE = schema_rule("stream_options", {"type": "object"}, {"stream": {"const": True}})


class OpenAIRequest(Sampling):
    """The fields both OpenAI generation requests take."""

    model_config = ConfigDict(json_schema_extra=STREAM_RULE)

    model: ModelId = Field(description="the id GET /v1/models lists")
    max_tokens: OutputLength = Field(None, description=MAX_TOKENS_TEXT)
    temperature: Temperature = Field(DEFAULT_TEMPERATURE, description="0 is greedy")
    n: ChoiceCount = Field(
        1,
        description="choices per prompt: the prompt is prefilled once and its KV shared; "
        "with a seed, choice i samples with seed + i",
    )
    stream_options: StreamOptions | None = None
    response_format: ResponseFormat | None = Field(
        None, description="text, any JSON object, or JSON following a schema (enforced)"
    )
    grammar: Text = Field(
        "",
        description="GBNF grammar the output follows (root rule: root); not with a "
        "response_format other than text, nor for chat with a tool_choice other than auto "
        "or none (it replaces the tools' grammar of auto)",
    )
    user: Text = Field(
        "",
        description="end user; the scheduling tenant unless 'tenant' is given "
        "(as is when a valid tenant name, else hashed)",
    )

    @model_validator(mode="after")
    def _stream_options_need_a_stream(self) -> Self:
        if self.stream_options is not None and not self.stream:
            message = "'stream_options' is only allowed with 'stream': true"
            raise cross_field("stream_options", message)
        if self.grammar and not self.text_format:
            message = "'grammar' excludes a 'response_format' other than text"
            raise cross_field("grammar", message)
        return self

    @property
    def text_format(self) -> bool:
        """``response_format`` leaves the output free (absent, or text)."""
        return self.response_format is None or self.response_format.type == "text"

    @property
    def include_usage(self) -> bool:
        """The stream ends with a usage chunk."""
        return self.stream_options is not None and bool(self.stream_options.include_usage)


# -- chat ------------------------------------------------------------------------------------------


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


# Not in the document, checked here (the fields' descriptions say them): max_tokens and
# max_completion_tokens agree when both are given; continue_final_message needs a final
# assistant message; tools name each function once; a named tool_choice is one of them.
# Also that response_format excludes tools, and grammar a response_format other than text and
# a tool_choice other than auto: JSON Schema can say it, but more conditionals take the
# document past what schemathesis can generate requests from (tests/integration/test_fuzz.py).
_A_TOOL_CHOICE = {"anyOf": [{"enum": ["auto", "required"]}, {"type": "object"}]}
# The rules of a Conversation's fields that the document states (chat and /tokenize).
CONVERSATION_RULES = [
    schema_rule(
        "continue_final_message",
        {"const": True},
        {"add_generation_prompt": {"enum": [False, None]}},
        required=False,
    ),
    schema_rule("tool_choice", _A_TOOL_CHOICE, {"tools": {"type": "array", "minItems": 1}}),
]
_CHAT_RULES: JsonDict = {
    "allOf": [
        STREAM_RULE,
        schema_rule("top_logprobs", {"type": "integer"}, {"logprobs": {"const": True}}),
        *CONVERSATION_RULES,
    ]
}


class ConversationFields(Request):
    """How messages are rendered into a prompt: the fields chat completions and ``/tokenize``
    share (``Conversation`` holds them with the messages)."""

    add_generation_prompt: bool | None = Field(
        None,
        description="end the prompt with the assistant's header "
        "(default: true unless continue_final_message)",
    )
    continue_final_message: bool = Field(
        False, description="the reply continues the final message, which must be the assistant's"
    )
    tools: list[Tool] = Field(
        [],
        description="functions the model may call, each name once, described in the prompt; "
        "with a response_format other than text, the reply is a call or that format",
    )
    tool_choice: ToolChoice | None = Field(
        None,
        description="none (the tools stay out of the prompt), auto (the default with tools), "
        "required, or a named function (one of tools); anything but none needs tools",
    )

    @property
    def calls_tools(self) -> bool:
        """The reply may be tool calls: tools offered, and ``tool_choice`` not none."""
        return bool(self.tools) and self.tool_choice != "none"

    @property
    def ends_with_generation_prompt(self) -> bool:
        """``add_generation_prompt`` with its default resolved."""
        if self.add_generation_prompt is None:
            return not self.continue_final_message
        return self.add_generation_prompt

    def check_conversation(self, messages: list[ChatMessage]) -> None:
        """The rules across these fields and ``messages`` the document does not say (400s)."""
        if self.continue_final_message and self.add_generation_prompt:
            message = "'continue_final_message' and 'add_generation_prompt' exclude each other"
            raise cross_field("add_generation_prompt", message)
        if self.continue_final_message and messages[-1].role != "assistant":
            message = "'continue_final_message' needs a final message from the assistant"
            raise cross_field("continue_final_message", message)
        choice = self.tool_choice
        if choice not in (None, "none") and not self.tools:
            raise cross_field("tool_choice", "'tool_choice' needs 'tools'")
        names = [tool.function.name for tool in self.tools]
        if len(set(names)) != len(names):
            raise cross_field("tools", "'tools' names a function twice")
        if isinstance(choice, NamedToolChoice) and choice.function.name not in names:
            raise cross_field("tool_choice", f"no tool is named {choice.function.name!r}")


class ChatCompletionRequest(OpenAIRequest, ConversationFields):
    """``POST /v1/chat/completions``."""

    model_config = ConfigDict(json_schema_extra=_CHAT_RULES)

    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    logprobs: bool = Field(False, description="report logprobs of each token")
    top_logprobs: LogprobCount | None = Field(None, description="alternatives per token")
    max_completion_tokens: OutputLength = Field(
        None, description="same as max_tokens (both given: they must agree)"
    )
    parallel_tool_calls: bool = Field(True, description="the reply may hold several calls")
    # Accepted silently: bookkeeping and hints for OpenAI's own service.
    metadata: Any = Field(None, description=IGNORED)
    service_tier: Any = Field(None, description=IGNORED)
    safety_identifier: Any = Field(None, description=IGNORED)
    prompt_cache_key: Any = Field(None, description="accepted; this server caches every prefix")
    prompt_cache_retention: Any = Field(None, description=IGNORED)
    prompt_cache_options: Any = Field(None, description=IGNORED)
    # Features this server lacks, where the reply without them is still valid: ignored, and
    # reported. Audio output is not such a feature: a reply without it is a 400.
    store: Annotated[Any, Ignored((False,))] = None
    functions: Annotated[Any, Ignored(([],))] = None
    function_call: Annotated[Any, Ignored(("none",))] = None
    modalities: Annotated[Any, Ignored((["text"],))] = None
    audio: Annotated[Any, OnlyDefault()] = None
    prediction: Annotated[Any, Ignored()] = None
    web_search_options: Annotated[Any, Ignored()] = None
    reasoning_effort: Annotated[Any, Ignored()] = None
    verbosity: Annotated[Any, Ignored()] = None
    moderation: Annotated[Any, Ignored()] = None

    @model_validator(mode="after")
    def _rules_across_fields(self) -> Self:
        if self.top_logprobs is not None and not self.logprobs:
            raise cross_field("top_logprobs", "'top_logprobs' needs 'logprobs': true")
        new, old = self.max_completion_tokens, self.max_tokens
        if new is not None and old is not None and new != old:
            message = "'max_tokens' and 'max_completion_tokens' differ"
            raise cross_field("max_completion_tokens", message)
        self.check_conversation(self.messages)
        if self.grammar and self.calls_tools and self.tool_choice not in (None, "auto"):
            message = "'grammar' replaces the tools' grammar of tool_choice auto only"
            raise cross_field("grammar", message)
        return self
