"""``POST /v1/embeddings`` in OpenAI's shapes: one input or many, as text or token ids; each
vector as a list of floats or as base64 of its little-endian float32 bytes."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, WithJsonSchema

from tinyserve.frontend.models.common import INTEGRAL, Reply, Request, Text, expect
from tinyserve.frontend.models.fields import Priority, Tenant, TokenId

# OpenAI's limit on the inputs of one request.
MAX_INPUTS = 2048

_TEXT = {"type": "string", "minLength": 1}
_IDS = {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0}}
# The rules the handler checks to name ``input[i]`` in its 400 (an input empty, too many of
# them), stated in the document; an input's token count and ids depend on the model.
_INPUT_SCHEMA = {
    "anyOf": [
        _TEXT,
        {"type": "array", "minItems": 1, "maxItems": MAX_INPUTS, "items": _TEXT},
        _IDS,
        {"type": "array", "minItems": 1, "maxItems": MAX_INPUTS, "items": _IDS},
    ]
}
EmbeddingsInput = Annotated[
    Text | list[Text] | list[TokenId] | list[list[TokenId]],
    expect("a string, a list of strings, a list of token ids or a list of lists of token ids"),
    WithJsonSchema(_INPUT_SCHEMA),
]


class EmbeddingsRequest(Request):
    model: Text | None = Field(None, description="when given, the id GET /v1/models lists")
    input: EmbeddingsInput = Field(
        description=f"what to embed: each string or list of token ids is one input (at most "
        f"{MAX_INPUTS}, each at most --embedding-max-tokens tokens)"
    )
    encoding_format: Literal["float", "base64"] = Field(
        "float", description="base64: each vector's little-endian float32 bytes"
    )
    dimensions: Annotated[int, Field(ge=1), INTEGRAL] | None = Field(
        None, description="when given, the model's embedding size (vectors are not shortened)"
    )
    user: Text | None = Field(None, description="accepted and ignored")
    priority: Priority = Field(
        0, description="larger is more important among embedding requests (--policy priority)"
    )
    tenant: Tenant = Field("default", description="fairness group (--policy wfq)")


class Embedding(Reply):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str = Field(description="L2-normalised")


class EmbeddingsUsage(Reply):
    prompt_tokens: int
    total_tokens: int


class EmbeddingsReply(Reply):
    object: Literal["list"] = "list"
    data: list[Embedding]
    model: str
    usage: EmbeddingsUsage
