"""``POST /v1/responses`` (OpenAI's Responses API): the request body, and its translation
into the conversation the rest of the frontend serves (``models.conversation``).

Shapes follow OpenAI's API reference (platform.openai.com, Responses): ``input`` as text or
a list of items (messages, ``function_call``s of earlier turns and their
``function_call_output``s), ``instructions``, function ``tools``, ``tool_choice``,
``text.format``, ``max_output_tokens``. This server keeps no responses: ``store`` is
ignored, and ``previous_response_id`` (or a stored ``conversation``) is a 400 saying to send
the whole conversation in ``input``, as a stateless client (``store: false``) does. What this
server does not know or does not do (unknown fields, tools other than functions, ``include``,
``reasoning``...) is accepted, ignored and reported, and the sampling extensions of the other
surfaces are taken too.

The translation (``turn``) makes the equivalent conversation from what the model validated,
as chat completions would have it: ``instructions`` is the first system message, a function
call an assistant's tool call (with the text before it, when there is some), its output a
tool message, ``text.format`` the ``response_format``; chat's rules across tools and a
grammar apply, in chat's words (``check_tools``).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Self

from pydantic import ConfigDict, Discriminator, Field, Tag, model_validator

from tinyserve.frontend.models.common import (
    IGNORED,
    OTHER,
    RULE,
    Body,
    Ignored,
    IgnoredItem,
    OnlyDefault,
    Text,
    cross_field,
    open_by_type,
    schema_rule,
)
from tinyserve.frontend.models.conversation import (
    ChatMessage,
    Conversation,
    Turn,
    check_grammar,
    check_tools,
)
from tinyserve.frontend.models.fields import (
    DEFAULT_TEMPERATURE,
    MAX_TOKENS_TEXT,
    ModelId,
    OutputLength,
    Sampling,
    Temperature,
)
from tinyserve.frontend.models.response_format import (
    JsonObjectFormat,
    JsonSchemaSpec,
    ResponseFormat,
)
from tinyserve.frontend.models.tools import FunctionName, ToolChoice
from tinyserve.frontend.models.translated import (
    LIST,
    TEXT,
    chat_message,
    function_tool,
    json_schema_format,
    named_choice,
    tag,
    text_or_list,
    tool_call,
    type_of,
)

STATELESS = "this server keeps no responses (send the whole conversation in 'input')"

# -- input items ----------------------------------------------------------------------------------


class InputText(Body):
    type: Literal["input_text"]
    text: Text


class OutputText(Body):
    """An assistant's text, as an earlier response's output item holds it."""

    type: Literal["output_text"]
    text: Text
    annotations: Annotated[Any, Ignored(([],))] = None
    logprobs: Any = Field(None, description=IGNORED)


# Parts of other types (an image, a file, a refusal) are ignored, and reported.
Part = Annotated[
    Annotated[InputText, Tag(tag("input_text"))]
    | Annotated[OutputText, Tag(tag("output_text"))]
    | Annotated[IgnoredItem, Tag(OTHER)],
    open_by_type("a content part with a 'type'", "input_text", "output_text"),
]
PartsContent = Annotated[
    Annotated[Text, Tag(TEXT)] | Annotated[list[Part], Field(min_length=1), Tag(LIST)],
    text_or_list("a non-empty list of text parts"),
]


class _Item(Body):
    id: Any = Field(None, description=IGNORED)
    status: Any = Field(None, description=IGNORED)


class MessageItem(_Item):
    """A message; ``developer`` is taken as ``system``, parts joined by newlines."""

    type: Literal["message"] | None = Field("message", description="may be left out")
    role: Literal["user", "assistant", "system", "developer"]
    content: PartsContent
    phase: Any = Field(None, description=IGNORED)

    @property
    def text(self) -> str:
        return _text(self.content)


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(p.text for p in content if isinstance(p, InputText | OutputText))


class FunctionCallItem(_Item):
    """A function call an earlier response made."""

    type: Literal["function_call"]
    call_id: Text
    name: FunctionName
    arguments: Text = Field(description="the arguments as JSON text")
    namespace: Any = Field(None, description=IGNORED)


class FunctionCallOutputItem(_Item):
    """A function call's result."""

    type: Literal["function_call_output"]
    call_id: Text
    output: Annotated[
        Annotated[Text, Tag(TEXT)] | Annotated[list[Part], Tag(LIST)],
        text_or_list("a list of content parts"),
    ]

    @property
    def text(self) -> str:
        return _text(self.output)


class ReasoningItem(_Item):
    """Reasoning of an earlier response: accepted, and left out of the prompt (templates
    render no thinking of turns before the last user message)."""

    type: Literal["reasoning"]
    summary: Any = Field(None, description=IGNORED)
    content: Any = Field(None, description=IGNORED)
    encrypted_content: Any = Field(None, description=IGNORED)


# A message may leave its type out (OpenAI's "easy input message"). Items of other types (a
# custom tool's call, a web search, an item reference) are ignored, and reported.
Item = Annotated[
    Annotated[MessageItem, Tag(tag("message"))]
    | Annotated[FunctionCallItem, Tag(tag("function_call"))]
    | Annotated[FunctionCallOutputItem, Tag(tag("function_call_output"))]
    | Annotated[ReasoningItem, Tag(tag("reasoning"))]
    | Annotated[IgnoredItem, Tag(OTHER)],
    open_by_type(
        "an input item",
        "message",
        "function_call",
        "function_call_output",
        "reasoning",
        missing="message",
    ),
]
Input = Annotated[
    Annotated[Text, Tag(TEXT)] | Annotated[list[Item], Field(min_length=1), Tag(LIST)],
    text_or_list("a non-empty list of input items"),
]


# The input items a conversation is made of (``chat_messages``): reasoning and items of other
# types are left out.
_CONVERSATION_ITEMS = MessageItem | FunctionCallItem | FunctionCallOutputItem


def chat_messages(items: list[Any]) -> list[ChatMessage]:
    """Input items as chat messages: consecutive function calls are one assistant message's
    tool calls (the assistant's text before them included)."""
    messages: list[ChatMessage] = []
    for item in items:
        if isinstance(item, FunctionCallItem):
            call = tool_call(item.call_id, item.name, item.arguments)
            if not (messages and messages[-1].role == "assistant"):
                messages.append(chat_message("assistant", None))
            calls = [*(messages[-1].tool_calls or []), call]
            messages[-1] = messages[-1].model_copy(update={"tool_calls": calls})
        elif isinstance(item, FunctionCallOutputItem):
            messages.append(chat_message("tool", item.text, tool_call_id=item.call_id))
        elif isinstance(item, MessageItem):
            messages.append(chat_message(item.role, item.text))
    return messages


# -- tools and text format ------------------------------------------------------------------------


class FunctionTool(Body):
    type: Literal["function"] = Field(description="function tools only")
    name: FunctionName = Field(description="1-64 of A-Z, a-z, 0-9, _, . and -")
    description: Text | None = Field(None, description="shown to the model")
    parameters: dict[str, Any] | None = Field(
        None, description="JSON schema of the arguments (enforced when a call is made)"
    )
    strict: bool | None = Field(None, description="always enforced")


# Tools of other types (custom, web_search, local_shell, mcp, a namespace of tools...) are
# ignored, and reported: the model is offered the function tools.
ToolItem = Annotated[
    Annotated[FunctionTool, Tag(tag("function"))] | Annotated[IgnoredItem, Tag(OTHER)],
    open_by_type("a tool object with a 'type'", "function"),
]


class FunctionChoice(Body):
    type: Literal["function"]
    name: FunctionName


ResponsesToolChoice = Literal["none", "auto", "required"] | FunctionChoice


class TextFormatText(Body):
    type: Literal["text"]


class TextFormatJsonObject(Body):
    type: Literal["json_object"]


class TextFormatJsonSchema(JsonSchemaSpec):
    """A ``response_format``'s ``json_schema``, flattened beside its ``type``."""

    type: Literal["json_schema"]


TextFormat = Annotated[
    Annotated[TextFormatText, Tag(tag("text"))]
    | Annotated[TextFormatJsonObject, Tag(tag("json_object"))]
    | Annotated[TextFormatJsonSchema, Tag(tag("json_schema"))],
    Discriminator(
        type_of,
        custom_error_type=RULE,
        custom_error_message="must have 'type' text, json_object or json_schema",
    ),
]


class TextConfig(Body):
    format: TextFormat | None = Field(None, description="text, any JSON, or JSON by a schema")
    verbosity: Annotated[Any, Ignored()] = None

    def response_format(self) -> ResponseFormat | None:
        """The format as a conversation's ``response_format`` (None: text)."""
        if self.format is None or self.format.type == "text":
            return None
        if self.format.type == "json_object":
            return JsonObjectFormat.model_construct(type="json_object")
        return json_schema_format(self.format)


# -- the request ----------------------------------------------------------------------------------

# The document states that a tool choice other than auto and none needs tools; that
# text.format excludes tools is the field's description (and the tests' UNSTATED_RULES).
_CHOICE_NEEDS_TOOLS = schema_rule(
    "tool_choice",
    {"anyOf": [{"const": "required"}, {"type": "object"}]},
    {"tools": {"type": "array", "minItems": 1}},
)


class ResponsesRequest(Sampling):
    """``POST /v1/responses``."""

    model_config = ConfigDict(json_schema_extra=_CHOICE_NEEDS_TOOLS)

    model: ModelId = Field(description="the id GET /v1/models lists")
    input: Input = Field(description="text, or a list of messages and function call items")
    instructions: Text | None = Field(None, description="the system message, before 'input'")
    tools: list[ToolItem] = Field(
        [], description="functions the model may call (tools of other types: ignored)"
    )
    tool_choice: ResponsesToolChoice | None = Field(
        None, description="none, auto (the default with tools), required, or a function"
    )
    parallel_tool_calls: bool = Field(True, description="the reply may hold several calls")
    text: TextConfig | None = Field(
        None, description="format: the output's, enforced (with tools: a call, or the format)"
    )
    max_output_tokens: OutputLength = Field(None, description=MAX_TOKENS_TEXT)
    temperature: Temperature = Field(DEFAULT_TEMPERATURE, description="0 is greedy")
    user: Text = Field("", description="end user: the tenant unless 'tenant' is given")
    # Asking to keep the response is ignored (nothing is kept: a later previous_response_id is
    # the 400); one that names what was kept cannot be served.
    store: Annotated[Any, Ignored((False,))] = None
    previous_response_id: Annotated[Any, OnlyDefault((), STATELESS)] = None
    conversation: Annotated[Any, OnlyDefault((), STATELESS)] = None
    background: Annotated[Any, OnlyDefault((False,))] = None
    prompt: Annotated[Any, OnlyDefault()] = None
    include: Annotated[Any, Ignored(([],))] = None
    reasoning: Annotated[Any, Ignored()] = None
    truncation: Annotated[Any, Ignored(("disabled",))] = None
    top_logprobs: Annotated[Any, Ignored((0,))] = None
    max_tool_calls: Annotated[Any, Ignored()] = None
    context_management: Annotated[Any, Ignored()] = None
    # Ignored: bookkeeping and hints for OpenAI's own service.
    metadata: Any = Field(None, description=IGNORED)
    stream_options: Any = Field(None, description=IGNORED)
    service_tier: Any = Field(None, description=IGNORED)
    safety_identifier: Any = Field(None, description=IGNORED)
    prompt_cache_key: Any = Field(None, description=IGNORED)
    prompt_cache_retention: Any = Field(None, description=IGNORED)
    prompt_cache_options: Any = Field(None, description=IGNORED)

    @property
    def function_tools(self) -> list[FunctionTool]:
        return [tool for tool in self.tools if isinstance(tool, FunctionTool)]

    @model_validator(mode="after")
    def _rules_across_fields(self) -> Self:
        items = self.input
        if isinstance(items, list) and not any(isinstance(i, _CONVERSATION_ITEMS) for i in items):
            message = "'input' has no message to answer (items of other types are ignored)"
            raise cross_field("input", message)
        check_grammar(self.grammar, self._response_format() is None)
        check_tools([tool.name for tool in self.function_tools], self._tool_choice(), self.grammar)
        return self

    def turn(self) -> Turn:
        """The turn this request asks for in its conversation; the sampling fields it left
        out take the serve-side defaults."""
        items = self.input
        messages = [chat_message("user", items)] if isinstance(items, str) else chat_messages(items)
        if self.instructions is not None:
            messages.insert(0, chat_message("system", self.instructions))
        tools = [function_tool(t.name, t.description, t.parameters) for t in self.function_tools]
        conversation = Conversation(messages=messages, tools=tools, tool_choice=self._tool_choice())
        return Turn(
            conversation=conversation,
            sampling=self,
            max_tokens=self.max_output_tokens,
            user=self.user,
            parallel_tool_calls=self.parallel_tool_calls,
            response_format=self._response_format(),
        )

    def _tool_choice(self) -> ToolChoice | None:
        """The tool choice as chat's (``auto`` without tools is none)."""
        choice = self.tool_choice
        if isinstance(choice, FunctionChoice):
            return named_choice(choice.name)
        return None if choice == "auto" and not self.function_tools else choice

    def _response_format(self) -> ResponseFormat | None:
        return None if self.text is None else self.text.response_format()
