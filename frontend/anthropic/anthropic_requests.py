"""``POST /v1/messages`` and ``POST /v1/messages/count_tokens`` (Anthropic's Messages API):
the request bodies, and their translation into the conversation the rest of the frontend
serves (``models.conversation``).

Shapes follow Anthropic's API reference (docs.anthropic.com, Messages): ``system`` as text
or text blocks, ``messages`` whose content is text or blocks (``text``; ``tool_use`` in an
assistant turn, ``tool_result`` in a user turn), client tools with an ``input_schema``,
``tool_choice`` (auto, any, tool, none), ``thinking``. As on every surface, what this
server does not know or does not do (unknown fields, server tools, image and document
blocks, ``output_config.effort``...) is accepted, ignored and reported (``Ignored``,
``IgnoredItem``), and the sampling extensions (``top_k``, ``min_p``, ``priority``,
``tenant``, ``return_progress``...) are taken too.

A request's turns and their content blocks are ``anthropic_messages``'s. The translation
(``conversation``, and for Messages ``turn``) makes the equivalent
conversation from what the models validated, as chat completions would have it: a tool result
becomes a tool message, a tool use an assistant tool call, ``any`` is ``required``,
``output_config.format`` is a ``response_format``; chat's rules across tools and a grammar
apply, in chat's words (``check_tools``). Rendering, tool prompts and grammars, structured
output and sampling defaults are then the chat path's.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Self

from pydantic import ConfigDict, Discriminator, Field, Tag, model_validator

from tinyserve.frontend.anthropic.anthropic_messages import (
    BILLING_HEADER,
    MessageParam,
    TextOrBlocks,
    joined,
)
from tinyserve.frontend.models.common import (
    IGNORED,
    OTHER,
    RULE,
    Body,
    Ignored,
    IgnoredItem,
    Integer,
    Number,
    Request,
    Text,
    open_by_type,
    schema_rule,
)
from tinyserve.frontend.models.conversation import (
    Conversation,
    Turn,
    check_grammar,
    check_tools,
)
from tinyserve.frontend.models.fields import ModelId, Sampling, Stop
from tinyserve.frontend.models.response_format import JsonSchemaFormat, JsonSchemaSpec
from tinyserve.frontend.models.tools import FunctionName, ToolChoice
from tinyserve.frontend.models.translated import (
    chat_message,
    function_tool,
    json_schema_format,
    named_choice,
    tag,
    type_of,
)

# -- tools and output -----------------------------------------------------------------------------


class AnthropicTool(Body):
    """A client tool: the model's call follows ``input_schema`` (a grammar enforces what it
    can). Server tools (``web_search_...``, ``code_execution_...``) are other types: ignored."""

    name: FunctionName = Field(description="1-64 of A-Z, a-z, 0-9, _, . and -")
    description: Text | None = Field(None, description="shown to the model")
    input_schema: dict[str, Any] = Field(description="JSON schema of the tool's input")
    type: Literal["custom"] | None = Field(None, description="client tools; others: ignored")
    strict: bool | None = Field(None, description="always enforced")
    cache_control: Any = Field(None, description=IGNORED)
    input_examples: Any = Field(None, description=IGNORED)
    defer_loading: Annotated[Any, Ignored((False,))] = None


AnthropicToolItem = Annotated[
    Annotated[AnthropicTool, Tag(tag("custom"))] | Annotated[IgnoredItem, Tag(OTHER)],
    open_by_type("a tool object", "custom", missing="custom"),
]


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


# Anthropic's tool choices as chat's (a named tool is a named function: ``named_choice``).
_CHAT_CHOICE: dict[str, ToolChoice] = {"auto": "auto", "any": "required", "none": "none"}


class JsonOutputFormat(Body):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema", description="JSON schema the reply follows")


class OutputConfig(Body):
    format: JsonOutputFormat | None = Field(None, description="structured output (enforced)")
    effort: Annotated[Any, Ignored()] = None


class ThinkingConfig(Body):
    """Whether the model thinks first. A model whose template thinks does so whatever this
    says, and its thinking comes back as thinking blocks; one that does not, does not."""

    type: Literal["enabled", "adaptive", "disabled"]
    budget_tokens: Annotated[int, Integer(0)] | None = Field(
        None, description="accepted; the thinking counts against max_tokens"
    )


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
    tools: list[AnthropicToolItem] = Field(
        [], description="client tools the model may use, each name once (server tools: ignored)"
    )
    tool_choice: AnthropicToolChoice | None = Field(
        None,
        description="auto (the default with tools), any, a named tool (one of tools), or none",
    )
    output_config: OutputConfig | None = Field(
        None, description="format: JSON following a schema (with tools: a call, or the JSON)"
    )
    thinking: ThinkingConfig | None = Field(None, description="enabled, adaptive or disabled")
    mcp_servers: Annotated[Any, Ignored(([],))] = None
    container: Annotated[Any, Ignored()] = None
    context_management: Annotated[Any, Ignored()] = None

    @property
    def client_tools(self) -> list[AnthropicTool]:
        return [tool for tool in self.tools if isinstance(tool, AnthropicTool)]

    def conversation(self) -> Conversation:
        """The conversation: the system prompt first, then each turn as chat messages; the
        client tools, and the tool choice as chat's (``any`` is ``required``, a tool a named
        function; ``auto`` without tools is none)."""
        messages = [m for turn in self.messages for m in turn.chat_messages()]
        system = self._system_text()
        if system is not None:
            messages.insert(0, chat_message("system", system))
        tools = [function_tool(t.name, t.description, t.input_schema) for t in self.client_tools]
        return Conversation(messages=messages, tools=tools, tool_choice=self._tool_choice())

    def _tool_choice(self) -> ToolChoice | None:
        choice = self.tool_choice
        if choice is None or (choice.type == "auto" and not self.client_tools):
            return None
        if isinstance(choice, NamedChoice):
            return named_choice(choice.name)
        return _CHAT_CHOICE[choice.type]

    def _check_tools(self, grammar: str = "") -> None:
        check_tools([tool.name for tool in self.client_tools], self._tool_choice(), grammar)

    def _response_format(self) -> JsonSchemaFormat | None:
        output = self.output_config
        if output is None or output.format is None:
            return None
        spec = JsonSchemaSpec.model_construct(name="output", schema_=output.format.schema_)
        return json_schema_format(spec)

    def _system_text(self) -> str | None:
        """The system prompt, without Claude Code's billing block (``BILLING_HEADER``)."""
        if self.system is None or isinstance(self.system, str):
            return self.system
        blocks = [b for b in self.system if not b.text.startswith(BILLING_HEADER)]
        return joined(blocks) if blocks else None


class CountTokensRequest(AnthropicConversation):
    """``POST /v1/messages/count_tokens``."""

    @model_validator(mode="after")
    def _rules_across_fields(self) -> Self:
        self._check_tools()
        return self


class MessagesRequest(AnthropicConversation, Sampling):
    """``POST /v1/messages``."""

    max_tokens: Annotated[int, Integer(1)] = Field(
        description="tokens to generate (more than --max-tokens-limit or the context left: clamped)"
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

    @model_validator(mode="after")
    def _rules_across_fields(self) -> Self:
        check_grammar(self.grammar, self._response_format() is None)
        self._check_tools(self.grammar)
        return self

    def turn(self) -> Turn:
        """The turn this request asks for in its conversation; the sampling fields it left
        out take the serve-side defaults."""
        choice = self.tool_choice
        parallel = not (isinstance(choice, _Choice) and choice.disable_parallel_tool_use)
        user = self.metadata.user_id if self.metadata is not None else None
        return Turn(
            conversation=self.conversation(),
            sampling=self,
            max_tokens=self.max_tokens,
            user=user or "",
            parallel_tool_calls=parallel,
            response_format=self._response_format(),
        )
