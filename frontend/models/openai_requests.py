"""``POST /v1/completions`` and ``POST /v1/chat/completions`` request bodies.

Every field of OpenAI's request schemas is one of: supported (declared with its type);
ignored (bookkeeping or hints for OpenAI's own service that cannot change the output,
declared ``Any`` and ``IGNORED``); a feature this server lacks, accepted at its default
(``OnlyDefault``); anything else is refused as unknown. ``null`` means the default for every
known field. Extensions: ``priority``, ``tenant``, ``top_k``, ``ignore_eos``, and for chat
``add_generation_prompt`` / ``continue_final_message``.
"""

from __future__ import annotations

import hashlib
import re
from typing import Annotated, Any, Self

from pydantic import BeforeValidator, ConfigDict, Field, model_validator

from tinyserve.config import Config
from tinyserve.frontend.models.common import (
    IGNORED,
    INTEGRAL,
    Body,
    OnlyDefault,
    Text,
    cross_field,
    expect,
    schema_rule,
    unsupported,
)
from tinyserve.frontend.models.fields import (
    MAX_TOKENS_TEXT,
    TENANT_PATTERN,
    OutputLength,
    Penalty,
    Sampling,
    Temperature,
)
from tinyserve.frontend.models.response_format import ResponseFormat
from tinyserve.frontend.request.generation import Generation

MAX_LOGPROBS = 5
DEFAULT_TEMPERATURE = 1.0  # OpenAI's default; /generate's is 0 (greedy)

LogprobCount = Annotated[
    int, Field(ge=0, le=MAX_LOGPROBS), INTEGRAL, expect(f"an integer between 0 and {MAX_LOGPROBS}")
]
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
    n: Annotated[
        Any, OnlyDefault((1,), "this server returns one choice per request; send n requests")
    ] = None
    stream_options: StreamOptions | None = None
    presence_penalty: Penalty = Field(0.0, description="penalise tokens already present")
    frequency_penalty: Penalty = Field(0.0, description="penalise tokens by their count")
    response_format: ResponseFormat | None = Field(
        None, description="text, any JSON object, or JSON following a schema (enforced)"
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
        return self

    @property
    def include_usage(self) -> bool:
        """The stream ends with a usage chunk."""
        return self.stream_options is not None and bool(self.stream_options.include_usage)

    def resolved(self, **overrides: Any) -> Generation:
        if "tenant" not in self.model_fields_set:
            overrides["tenant"] = _tenant_of_user(self.user)
        return super().resolved(**overrides)


def _tenant_of_user(user: str) -> str:
    """``user`` as the scheduling tenant: as it is when it is a valid tenant name, else a
    stable hash of it (OpenAI suggests hashed e-mail addresses and the like)."""
    if not user:
        return "default"
    if re.fullmatch(TENANT_PATTERN, user):
        return user
    return "user-" + hashlib.sha256(user.encode("utf-8")).hexdigest()[:16]


# -- completions ---------------------------------------------------------------------------------

PromptText = Annotated[Text, Field(min_length=1)]
TokenIds = Annotated[list[Annotated[int, Field(ge=0), INTEGRAL]], Field(min_length=1)]


def _one_prompt(value: Any) -> Any:
    """A list holding one prompt (a string or token ids) is that prompt."""
    if isinstance(value, list) and value and all(isinstance(v, str | list) for v in value):
        if len(value) > 1:
            raise unsupported("one prompt per request (no batches)")
        return value[0]
    return value


def _one_of(item: Any) -> Any:
    return Annotated[list[item], Field(min_length=1, max_length=1)]


Prompt = Annotated[
    PromptText | TokenIds,
    BeforeValidator(
        _one_prompt,
        json_schema_input_type=PromptText | TokenIds | _one_of(PromptText) | _one_of(TokenIds),
    ),
    expect("a non-empty string, a non-empty list of token ids >= 0, or a list of one of either"),
]


class CompletionRequest(OpenAIRequest):
    """``POST /v1/completions``."""

    prompt: Prompt = Field(description="a string, token ids, or a list holding one of either")
    logprobs: LogprobCount | None = Field(None, description="alternatives per token")
    best_of: Annotated[Any, OnlyDefault((1,))] = None
    echo: Annotated[Any, OnlyDefault((False,))] = None
    suffix: Annotated[Any, OnlyDefault(("",))] = None

    def generation(self, config: Config) -> Generation:
        """The request with every default resolved; the prompt is empty when it came as token
        ids (``prompt_ids``)."""
        return self.resolved(
            prompt=self.prompt if isinstance(self.prompt, str) else "",
            max_tokens=self.max_tokens or config.default_max_tokens,
            logprobs=-1 if self.logprobs is None else self.logprobs,
        )

    @property
    def prompt_ids(self) -> list[int] | None:
        """The prompt's token ids, when it came as token ids."""
        return None if isinstance(self.prompt, str) else self.prompt
