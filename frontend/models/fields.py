"""The field types the API surfaces share, each stating its bounds for validation, for the
document and for the 400 that names the field ("must be ..."), and ``Sampling``: the fields
of every generation request (``/generate``'s and the OpenAI requests')."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator, Field

from tinyserve.frontend.models.common import (
    INTEGRAL,
    Integer,
    Number,
    Request,
    Text,
    expect,
)
from tinyserve.frontend.models.progress import RETURN_PROGRESS_TEXT
from tinyserve.protocol import TENANT_PATTERN, TENANT_TEXT

# OpenAI allows 4; lm-evaluation-harness sends a task's `until` strings plus the EOS text, often
# more (vLLM and llama.cpp's server set no limit). Each costs the engine a scan per token.
MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 64
SEED_MAX = 2**32 - 1  # llama.cpp seeds are uint32
INT32_MAX = 2**31 - 1  # llama.cpp's counts are int32 (and msgpack stops at 64 bits)
TOP_K_MAX = INT32_MAX


def _one_as_list(value: Any) -> Any:
    return [value] if isinstance(value, str) else value


# A number of tokens to generate; null or absent: the surface's default. More than
# --max-tokens-limit or the context left is clamped (request.pipeline).
OutputLength = Annotated[int, Integer(1)] | None
Temperature = Annotated[float, Number(0, 2)]
TopP = Annotated[float, Number(0, 1, above_low=True)]
TopK = Annotated[
    int, Field(ge=0, le=TOP_K_MAX), INTEGRAL, expect(f"an integer between 0 (off) and {TOP_K_MAX}")
]
# Alternatives per token the API takes (OpenAI's completions allow 5); the engine would
# take up to protocol.MAX_TOP_LOGPROBS.
MAX_ALTERNATIVES = 5
DEFAULT_TEMPERATURE = 1.0  # OpenAI's default; /generate's is 0 (greedy)
LogprobCount = Annotated[int, Integer(0, MAX_ALTERNATIVES)]
ModelId = Annotated[Text, Field(min_length=1), expect("the id that GET /v1/models lists")]
TokenId = Annotated[int, Field(ge=0), INTEGRAL]
Seed = Annotated[int, Integer(0, SEED_MAX)]
Priority = Annotated[int, Integer(-10, 10)]
DEADLINE_MS_MAX = 3_600_000  # an hour
DeadlineMs = Annotated[int, Integer(1, DEADLINE_MS_MAX)]
Tenant = Annotated[
    str,
    Field(pattern=TENANT_PATTERN),
    expect(TENANT_TEXT),
]
Penalty = Annotated[float, Number(-2, 2)]
Fraction = Annotated[float, Number(0, 1)]
TypicalP = Annotated[float, Number(0, 1, above_low=True)]
RepetitionPenalty = Annotated[float, Number(0, 10, above_low=True)]
MinTokens = Annotated[int, Integer(0, INT32_MAX)]
MAX_LOGIT_BIAS = 300  # entries
LogitBias = Annotated[
    dict[
        Annotated[str, Field(pattern=r"^[0-9]{1,9}$")],
        Annotated[float, Field(ge=-100, le=100)],
    ],
    # pydantic states the key pattern as patternProperties, which leave other keys free.
    Field(max_length=MAX_LOGIT_BIAS, json_schema_extra={"additionalProperties": False}),
    expect(
        f"an object of at most {MAX_LOGIT_BIAS} token ids (as strings) to numbers "
        "between -100 and 100"
    ),
]
StopString = Annotated[Text, Field(min_length=1, max_length=MAX_STOP_CHARS)]
StopList = Annotated[list[StopString], Field(max_length=MAX_STOP_STRINGS)]
Stop = Annotated[
    StopList,
    BeforeValidator(_one_as_list, json_schema_input_type=StopString | StopList),
    expect(
        f"a string or a list of at most {MAX_STOP_STRINGS} strings, "
        f"each 1 to {MAX_STOP_CHARS} characters"
    ),
]

MAX_TOKENS_TEXT = (
    "tokens to generate (--default-max-tokens when absent, at most --max-tokens-limit)"
)


class Sampling(Request):
    """Sampling and scheduling fields of every generation request."""

    stream: bool = Field(False, description="reply as server-sent events")
    temperature: Temperature = Field(0.0, description="0 is greedy")
    top_p: TopP = Field(1.0, description="nucleus sampling")
    top_k: TopK = Field(0, description="0 disables it")
    ignore_eos: bool = Field(False, description="never end at an end-of-generation token")
    seed: Seed | None = Field(None, description="sampling seed; same seed, same text")
    stop: Stop = Field(
        [], description="generation ends before the first of these; the stop string is not returned"
    )
    min_p: Fraction = Field(0.0, description="drop tokens below min_p x the likeliest's odds")
    typical_p: TypicalP = Field(1.0, description="locally typical sampling (1: off)")
    repetition_penalty: RepetitionPenalty = Field(
        1.0, description="divide the logits of the last 64 tokens by it (1: off)"
    )
    presence_penalty: Penalty = Field(0.0, description="penalise tokens already present")
    frequency_penalty: Penalty = Field(0.0, description="penalise tokens by their count")
    min_tokens: MinTokens = Field(0, description="no end-of-generation token before this many")
    grammar: Text = Field("", description="GBNF grammar the output follows (root rule: root)")
    logit_bias: LogitBias = Field(
        {}, description="token id -> bias added to its logit (-100 bans, 100 forces)"
    )
    priority: Priority = Field(0, description="larger is more important (--policy priority)")
    tenant: Tenant = Field("default", description="fairness group")
    return_progress: bool = Field(False, description=RETURN_PROGRESS_TEXT)
    deadline_ms: DeadlineMs | None = Field(
        None,
        description="finish within this many ms of arrival, else end with deadline_missed "
        "(--policy deadline also admits the earliest deadline first)",
    )
