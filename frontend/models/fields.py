"""The field types the API surfaces share: each states its bounds once, for validation, for
the document, and for the 400 that names the field ("must be ...")."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator, Field

from tinyserve.frontend.models.common import INTEGRAL, OUTPUT_LENGTH, Text, expect

MAX_STOP_STRINGS = 4
MAX_STOP_CHARS = 64
PRIORITY_RANGE = (-10, 10)
TEMPERATURE_MAX = 2.0
PENALTY_MAX = 2.0  # and -2
SEED_MAX = 2**32 - 1  # llama.cpp seeds are uint32
TOP_K_MAX = 2**31 - 1  # llama.cpp's top_k is an int32 (and msgpack stops at 64 bits)
TENANT_PATTERN = r"^[A-Za-z0-9._-]{1,64}$"


def _one_as_list(value: Any) -> Any:
    return [value] if isinstance(value, str) else value


# A number of tokens to generate; null or absent: --default-max-tokens.
OutputLength = Annotated[
    Annotated[int, Field(ge=1), INTEGRAL, expect("an integer of at least 1")] | None,
    OUTPUT_LENGTH,
]
Temperature = Annotated[
    float, Field(ge=0, le=TEMPERATURE_MAX), expect(f"a number between 0 and {TEMPERATURE_MAX:g}")
]
TopP = Annotated[float, Field(gt=0, le=1), expect("a number in (0, 1]")]
TopK = Annotated[
    int, Field(ge=0, le=TOP_K_MAX), INTEGRAL, expect(f"an integer between 0 (off) and {TOP_K_MAX}")
]
Seed = Annotated[
    int, Field(ge=0, le=SEED_MAX), INTEGRAL, expect(f"null or an integer between 0 and {SEED_MAX}")
]
Priority = Annotated[
    int,
    Field(ge=PRIORITY_RANGE[0], le=PRIORITY_RANGE[1]),
    INTEGRAL,
    expect(f"an integer between {PRIORITY_RANGE[0]} and {PRIORITY_RANGE[1]}"),
]
Tenant = Annotated[
    str,
    Field(pattern=TENANT_PATTERN),
    expect("1 to 64 characters of A-Z, a-z, 0-9, '.', '_', '-'"),
]
Penalty = Annotated[
    float,
    Field(ge=-PENALTY_MAX, le=PENALTY_MAX),
    expect(f"a number between {-PENALTY_MAX:g} and {PENALTY_MAX:g}"),
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
