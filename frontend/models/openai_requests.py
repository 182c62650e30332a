"""``POST /v1/completions`` and ``POST /v1/chat/completions`` request bodies.

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

from typing import Annotated, Any, Self

from pydantic import BeforeValidator, ConfigDict, Field, model_validator
from pydantic.config import JsonDict

from tinyserve.frontend.models.common import (
    IGNORED,
    INTEGRAL,
    Body,
    Ignored,
    Integer,
    Text,
    cross_field,
    expect,
    schema_rule,
)
from tinyserve.frontend.models.fields import (
    MAX_TOKENS_TEXT,
    OutputLength,
    Sampling,
    Temperature,
)
from tinyserve.frontend.models.response_format import ResponseFormat

# Alternatives per token the API takes (OpenAI's completions allow 5); the engine would
# take up to protocol.MAX_TOP_LOGPROBS.
MAX_ALTERNATIVES = 5
DEFAULT_TEMPERATURE = 1.0  # OpenAI's default; /generate's is 0 (greedy)

MAX_CHOICES = 16  # n, and prompts x n on /v1/completions
ChoiceCount = Annotated[int, Integer(1, MAX_CHOICES)]
LogprobCount = Annotated[int, Integer(0, MAX_ALTERNATIVES)]
ModelId = Annotated[Text, Field(min_length=1), expect("the id that GET /v1/models lists")]


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


# -- completions ---------------------------------------------------------------------------------

PromptText = Annotated[Text, Field(min_length=1)]
TokenIds = Annotated[list[Annotated[int, Field(ge=0), INTEGRAL]], Field(min_length=1)]


def _prompt_list(value: Any) -> Any:
    """One prompt (a string, or token ids) is a list of one; a list of strings or of token-id
    lists is several (OpenAI's shapes)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value and not any(isinstance(v, str | list) for v in value):
        return [value]
    return value


def _list_of(item: Any) -> Any:
    return Annotated[list[item], Field(min_length=1, max_length=MAX_CHOICES)]


Prompts = Annotated[
    list[PromptText | TokenIds],
    Field(min_length=1, max_length=MAX_CHOICES),
    BeforeValidator(
        _prompt_list,
        json_schema_input_type=PromptText | TokenIds | _list_of(PromptText) | _list_of(TokenIds),
    ),
    expect(
        "a non-empty string, a non-empty list of token ids >= 0, or a list of 1 to "
        f"{MAX_CHOICES} of either"
    ),
]
OutputLengthOr0 = Annotated[int, Integer(0)] | None


# echo comes back in one JSON reply only.
_COMPLETION_RULES: JsonDict = {
    "allOf": [
        STREAM_RULE,
        schema_rule("stream", {"const": True}, {"echo": {"enum": [False, None]}}, required=False),
        schema_rule("max_tokens", {"const": 0}, {"echo": {"const": True}}),  # the prompt alone
    ]
}


class CompletionRequest(OpenAIRequest):
    """``POST /v1/completions``."""

    model_config = ConfigDict(json_schema_extra=_COMPLETION_RULES)

    prompt: Prompts = Field(
        description="a string, token ids, or a list of either: n choices per prompt, in order"
    )
    max_tokens: OutputLengthOr0 = Field(
        None, description=MAX_TOKENS_TEXT + "; 0 (with echo) returns the prompt alone"
    )
    logprobs: LogprobCount | None = Field(
        None, description="alternatives per token (with echo, for the prompt's tokens too)"
    )
    echo: bool = Field(
        False,
        description="the text starts with the prompt, and with logprobs so do the logprobs "
        "(the prompt's first token has none: null)",
    )
    best_of: Annotated[Any, Ignored((1,))] = None
    suffix: Annotated[Any, Ignored(("",))] = None

    @model_validator(mode="after")
    def _echo_alone_needs_echo(self) -> Self:
        if self.max_tokens == 0 and not self.echo:
            raise cross_field("max_tokens", "'max_tokens': 0 needs 'echo': true")
        if len(self.prompt) * self.n > MAX_CHOICES:
            message = f"prompts x n is {len(self.prompt) * self.n}, more than {MAX_CHOICES}"
            raise cross_field("n", message)
        if self.stream and self.echo:
            raise cross_field("echo", "'echo' does not stream: the reply is one JSON object")
        return self
