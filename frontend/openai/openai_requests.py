"""``POST /v1/completions``'s request body: a prompt, or several, as text or token ids. The
fields it shares with chat completions (``OpenAIRequest``), and the rules every OpenAI
request follows, are ``models.chat``'s.
"""

from __future__ import annotations

from typing import Annotated, Any, Self

from pydantic import BeforeValidator, ConfigDict, Field, model_validator
from pydantic.config import JsonDict

from tinyserve.frontend.models.chat import MAX_CHOICES, STREAM_RULE, OpenAIRequest
from tinyserve.frontend.models.common import (
    INTEGRAL,
    Ignored,
    Integer,
    Text,
    cross_field,
    expect,
    schema_rule,
)
from tinyserve.frontend.models.fields import MAX_TOKENS_TEXT, LogprobCount

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
