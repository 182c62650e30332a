"""``POST /v1/messages`` and ``POST /v1/messages/count_tokens`` (Anthropic's Messages API):
the request bodies, and their translation into the chat completion request the rest of the
frontend serves.

Shapes follow Anthropic's API reference (docs.anthropic.com, Messages): ``system`` as text
or text blocks, ``messages`` whose content is text or blocks (``text``; ``tool_use`` in an
assistant turn, ``tool_result`` in a user turn), client tools with an ``input_schema``,
``tool_choice`` (auto, any, tool, none). As on the OpenAI surface, unknown fields are
refused, fields for features this server lacks are accepted at their default only, and the
sampling extensions (``top_k``, ``min_p``, ``priority``, ``tenant``, ``return_progress``...)
are taken too.

The translation (``chat_request``) makes the equivalent ``ChatCompletionRequest``: a tool
result becomes a tool message, a tool use an assistant tool call, ``any`` is ``required``,
``output_config.format`` is a ``response_format``. Rendering, tool prompts and grammars,
structured output and sampling defaults are then the chat surface's own.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal, Self

from pydantic import ConfigDict, Discriminator, Field, Tag, model_validator

from tinyserve.frontend.models.chat import ChatCompletionRequest
from tinyserve.frontend.models.common import (
    IGNORED,
    OUTPUT_LENGTH,
    RULE,
    Body,
    Integer,
    Number,
    OnlyDefault,
    Request,
    Text,
    cross_field,
    schema_rule,
)
from tinyserve.frontend.models.fields import Sampling, Stop
from tinyserve.frontend.models.openai_requests import ModelId
from tinyserve.frontend.models.tools import FunctionName
from tinyserve.frontend.models.translated import (
    LIST,
    TEXT,
    by_type,
    chat_request,
    sampling_fields,
    tag,
    text_or_list,
    type_of,
)

# -- content blocks -------------------------------------------------------------------------------


class TextBlock(Body):
    type: Literal["text"]
    text: Text
    cache_control: Any = Field(None, description="accepted; this server caches every prefix")
    citations: Annotated[Any, OnlyDefault(([],))] = None


TextBlocks = Annotated[list[TextBlock], Field(min_length=1)]
TextOrBlocks = Annotated[
    Annotated[Text, Tag(TEXT)] | Annotated[TextBlocks, Tag(LIST)],
    text_or_list("a non-empty list of text blocks"),
]


class ToolUseBlock(Body):
    """A tool call of an earlier assistant turn."""

    type: Literal["tool_use"]
    id: Text
    name: FunctionName
    input: dict[str, Any]
    cache_control: Any = Field(None, description=IGNORED)


class ToolResultBlock(Body):
    """A tool's result, in a user turn."""

    type: Literal["tool_result"]
    tool_use_id: Text
    content: TextOrBlocks | None = Field(None, description="text (none: empty)")
    is_error: bool | None = Field(False, description="the model reads the result as an error")
    cache_control: Any = Field(None, description=IGNORED)

    @property
    def text(self) -> str:
        content = self.content or ""
        text = content if isinstance(content, str) else _joined(content)
        return f"Error: {text}" if self.is_error else text


Block = Annotated[
    Annotated[TextBlock, Tag(tag("text"))]
    | Annotated[ToolUseBlock, Tag(tag("tool_use"))]
    | Annotated[ToolResultBlock, Tag(tag("tool_result"))],
    by_type("a content block of type text, tool_use or tool_result"),
]
AnthropicContent = Annotated[
    Annotated[Text, Tag(TEXT)] | Annotated[list[Block], Field(min_length=1), Tag(LIST)],
    text_or_list("a non-empty list of content blocks"),
]


class MessageParam(Body):
    """A turn: text, or blocks (``tool_use`` from the assistant, ``tool_result`` from the
    user)."""

    role: Literal["user", "assistant"]
    content: AnthropicContent

    @model_validator(mode="after")
    def _blocks_of_the_role(self) -> Self:
        wrong = "tool_result" if self.role == "assistant" else "tool_use"
        if not isinstance(self.content, str) and any(b.type == wrong for b in self.content):
            message = f"'content' of the {self.role}'s turn cannot hold a {wrong} block"
            raise cross_field("content", message)
        return self

    def chat_messages(self) -> list[dict[str, Any]]:
        """This turn as chat messages: a user turn's tool results are tool messages, in
        order; an assistant turn's tool uses are its tool calls."""
        if isinstance(self.content, str):
            return [{"role": self.role, "content": self.content}]
        if self.role == "assistant":
            return [_assistant_message(self.content)]
        messages: list[dict[str, Any]] = []
        for block in self.content:
            if isinstance(block, ToolResultBlock):
                messages.append(
                    {"role": "tool", "tool_call_id": block.tool_use_id, "content": block.text}
                )
                continue
            assert isinstance(block, TextBlock)  # a user turn holds no tool use (validated)
            if messages and messages[-1]["role"] == "user":
                messages[-1]["content"] += "\n" + block.text
            else:
                messages.append({"role": "user", "content": block.text})
        return messages


def _assistant_message(blocks: list[Any]) -> dict[str, Any]:
    text = _joined([b for b in blocks if isinstance(b, TextBlock)])
    calls = [
        {"id": b.id, "type": "function",
         "function": {"name": b.name, "arguments": json.dumps(b.input, ensure_ascii=False)}}
        for b in blocks
        if isinstance(b, ToolUseBlock)
    ]  # fmt: skip
    message: dict[str, Any] = {"role": "assistant", "content": text or None}
    if calls:
        message["tool_calls"] = calls
    return message


def _joined(blocks: list[TextBlock]) -> str:
    return "\n".join(block.text for block in blocks)


# -- tools and output -----------------------------------------------------------------------------


class AnthropicTool(Body):
    """A client tool: the model's call follows ``input_schema`` (a grammar enforces it)."""

    name: FunctionName = Field(description="1-64 of A-Z, a-z, 0-9, _, . and -")
    description: Text | None = Field(None, description="shown to the model")
    input_schema: dict[str, Any] = Field(description="JSON schema of the tool's input")
    type: Literal["custom"] | None = Field(None, description="client tools only")
    strict: bool | None = Field(None, description="always enforced")
    cache_control: Any = Field(None, description=IGNORED)
    input_examples: Any = Field(None, description=IGNORED)

    def chat_tool(self) -> dict[str, Any]:
        function = {"name": self.name, "description": self.description,
                    "parameters": self.input_schema}  # fmt: skip
        return {"type": "function", "function": function}


class _Choice(Body):
    disable_parallel_tool_use: bool | None = Field(False, description="at most one tool use")


class AutoChoice(_Choice):
    type: Literal["auto"]


class AnyChoice(_Choice):
    type: Literal["any"]


class NamedChoice(_Choice):
    type: Literal["tool"]
    name: FunctionName


class NoneChoice(Body):
    type: Literal["none"]


AnthropicToolChoice = Annotated[
    Annotated[AutoChoice, Tag(tag("auto"))]
    | Annotated[AnyChoice, Tag(tag("any"))]
    | Annotated[NamedChoice, Tag(tag("tool"))]
    | Annotated[NoneChoice, Tag(tag("none"))],
    Discriminator(
        type_of,
        custom_error_type=RULE,
        custom_error_message="must have 'type' auto, any, tool or none",
    ),
]


def _chat_tool_choice(choice: Any) -> Any:
    """Anthropic's tool choice as chat's: ``any`` is ``required``, a tool a named function."""
    if isinstance(choice, NamedChoice):
        return {"type": "function", "function": {"name": choice.name}}
    return {"auto": "auto", "any": "required", "none": "none"}[choice.type]


class JsonOutputFormat(Body):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema", description="JSON schema the reply follows")


class OutputConfig(Body):
    format: JsonOutputFormat | None = Field(None, description="structured output (enforced)")
    effort: Annotated[Any, OnlyDefault()] = None


class Metadata(Body):
    user_id: Text | None = Field(
        None, description="end user: the scheduling tenant unless 'tenant' is given"
    )


# -- requests -------------------------------------------------------------------------------------


# The document states that a tool choice other than auto and none needs tools; the rules it
# does not state are the fields' descriptions, and the tests' UNSTATED_RULES.
_CHOICE_NEEDS_TOOLS = schema_rule(
    "tool_choice",
    {"type": "object", "properties": {"type": {"enum": ["any", "tool"]}}, "required": ["type"]},
    {"tools": {"type": "array", "minItems": 1}},
)


class AnthropicConversation(Request):
    """What a Messages request and a token count share: the conversation and its tools."""

    model_config = ConfigDict(json_schema_extra=_CHOICE_NEEDS_TOOLS)

    model: ModelId = Field(description="the id GET /v1/models lists")
    messages: Annotated[list[MessageParam], Field(min_length=1)]
    system: TextOrBlocks | None = Field(None, description="the system prompt")
    tools: list[AnthropicTool] = Field(
        [], description="client tools the model may use, each name once"
    )
    tool_choice: AnthropicToolChoice | None = Field(
        None,
        description="auto (the default with tools), any, a named tool (one of tools), or none",
    )
    output_config: OutputConfig | None = Field(
        None, description="format: JSON following a schema (excludes tools)"
    )
    thinking: Annotated[Any, OnlyDefault(({"type": "disabled"},))] = None
    mcp_servers: Annotated[Any, OnlyDefault(([],))] = None
    container: Annotated[Any, OnlyDefault()] = None
    context_management: Annotated[Any, OnlyDefault()] = None

    @model_validator(mode="after")
    def _format_excludes_tools(self) -> Self:
        output = self.output_config
        if output is not None and output.format is not None and self._calls_tools:
            raise cross_field("output_config", "'output_config.format' excludes 'tools'")
        return self

    @property
    def _calls_tools(self) -> bool:
        return bool(self.tools) and not isinstance(self.tool_choice, NoneChoice)

    def chat_fields(self) -> dict[str, Any]:
        """The chat completion request's fields for this conversation."""
        messages = [m for turn in self.messages for m in turn.chat_messages()]
        if self.system is not None:
            system = self.system if isinstance(self.system, str) else _joined(self.system)
            messages.insert(0, {"role": "system", "content": system})
        fields: dict[str, Any] = {"model": self.model, "messages": messages}
        if self.tools:
            fields["tools"] = [tool.chat_tool() for tool in self.tools]
        choice = self.tool_choice
        if choice is not None and (self.tools or choice.type != "auto"):
            fields["tool_choice"] = _chat_tool_choice(choice)
        if isinstance(choice, _Choice) and choice.disable_parallel_tool_use:
            fields["parallel_tool_calls"] = False
        output = self.output_config
        if output is not None and output.format is not None:
            schema = {"name": "output", "schema": output.format.schema_}
            fields["response_format"] = {"type": "json_schema", "json_schema": schema}
        return fields

    def chat_request(self) -> ChatCompletionRequest:
        """The equivalent chat completion request."""
        return chat_request(self.chat_fields())


class CountTokensRequest(AnthropicConversation):
    """``POST /v1/messages/count_tokens``."""


class MessagesRequest(AnthropicConversation, Sampling):
    """``POST /v1/messages``."""

    max_tokens: Annotated[int, Integer(1), OUTPUT_LENGTH] = Field(
        description="tokens to generate (at most --max-tokens-limit)"
    )
    stop: Stop = Field(
        [],
        alias="stop_sequences",
        description="generation ends before the first of these (stop_reason stop_sequence)",
    )
    temperature: Annotated[float, Number(0, 1)] = Field(1.0, description="0 is greedy")
    metadata: Metadata | None = None
    service_tier: Any = Field(None, description=IGNORED)
    cache_control: Any = Field(None, description="accepted; this server caches every prefix")

    def chat_request(self) -> ChatCompletionRequest:
        """The equivalent chat completion request, sampling fields included (those left out
        stay out: the serve-side defaults apply)."""
        fields = self.chat_fields()
        fields |= sampling_fields(self)
        fields["max_tokens"] = self.max_tokens
        if self.metadata is not None and self.metadata.user_id:
            fields["user"] = self.metadata.user_id
        return chat_request(fields)
