"""``POST /v1/chat/completions``: the request body, and the turn it asks for (``turn``, in
the neutral ``conversation`` that every surface speaking in conversations hands the chat
path, its messages as they came); with ``OpenAIRequest``, the fields it shares with
``/v1/completions``, ``ConversationFields``, those it shares with ``/tokenize``, and
``FinishReason``, why a reply to a conversation ended.

Every field of OpenAI's request schemas is one of: supported (declared with its type);
accepted silently (bookkeeping or hints for OpenAI's own service that cannot change the
output, declared ``Any`` and ``IGNORED``); a feature this server lacks, accepted, ignored and
reported (``Ignored``), or refused where the reply would not do without it (``OnlyDefault``);
anything else is unknown, and ignored and reported too. ``null`` means the default for every
known field. Extensions: ``priority``, ``tenant``, ``top_k``, ``ignore_eos``, ``grammar``
(as llama.cpp's server takes it; not with a ``response_format`` other than text), and for
chat ``add_generation_prompt`` / ``continue_final_message``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Self

from pydantic import ConfigDict, Field, model_validator
from pydantic.config import JsonDict

from tinyserve.frontend.models.common import (
    IGNORED,
    Body,
    Ignored,
    Integer,
    OnlyDefault,
    Request,
    Text,
    cross_field,
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
    LogprobCount,
    ModelId,
    OutputLength,
    Sampling,
    Temperature,
)
from tinyserve.frontend.models.response_format import ResponseFormat
from tinyserve.frontend.models.tools import Tool, ToolChoice

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
        check_grammar(self.grammar, self.text_format)
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


# Not in the document, checked here (the fields' descriptions say them): max_tokens and
# max_completion_tokens agree when both are given; continue_final_message needs a final
# assistant message; tools name each function once; a named tool_choice is one of them.
# Also that response_format excludes tools, and grammar a response_format other than text and
# a tool_choice other than auto: JSON Schema can say it, but more conditionals take the
# document past what schemathesis can generate requests from (tests/integration/test_fuzz.py).
_A_TOOL_CHOICE = {"anyOf": [{"enum": ["auto", "required"]}, {"type": "object"}]}
# The rules of ConversationFields that the document states (chat and /tokenize).
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
    share (``conversation`` holds them with the messages)."""

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
    def ends_with_generation_prompt(self) -> bool:
        """``add_generation_prompt`` with its default resolved."""
        if self.add_generation_prompt is None:
            return not self.continue_final_message
        return self.add_generation_prompt

    def check_conversation(self, messages: list[ChatMessage], grammar: str = "") -> None:
        """The rules across these fields, ``messages`` and a ``grammar`` that the document
        does not say (400s)."""
        if self.continue_final_message and self.add_generation_prompt:
            message = "'continue_final_message' and 'add_generation_prompt' exclude each other"
            raise cross_field("add_generation_prompt", message)
        if self.continue_final_message and messages[-1].role != "assistant":
            message = "'continue_final_message' needs a final message from the assistant"
            raise cross_field("continue_final_message", message)
        check_tools([tool.function.name for tool in self.tools], self.tool_choice, grammar)

    def conversation(self, messages: list[ChatMessage]) -> Conversation:
        """The conversation of ``messages``, to be rendered as these fields say."""
        return Conversation(
            messages=messages,
            tools=self.tools,
            tool_choice=self.tool_choice,
            add_generation_prompt=self.ends_with_generation_prompt,
            continue_final_message=self.continue_final_message,
        )


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
        self.check_conversation(self.messages, self.grammar)
        return self

    def turn(self) -> Turn:
        """The turn this request asks for in its conversation."""
        return Turn(
            conversation=self.conversation(self.messages),
            sampling=self,
            max_tokens=self.max_completion_tokens or self.max_tokens,
            logprobs=(self.top_logprobs or 0) if self.logprobs else -1,
            user=self.user,
            parallel_tool_calls=self.parallel_tool_calls,
            response_format=self.response_format,
        )
