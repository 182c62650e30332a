"""OpenAI's ``response_format``: plain text, any JSON object, or JSON following a schema (the
schema is turned into a grammar by ``structured.constraints``)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag

from tinyserve.frontend.models.common import IGNORED, RULE, Body, Text

# A plain str: pydantic leaves a pattern given after a validator (Text's) out of the document.
# The pattern admits ASCII only, so Text's check for lone surrogates has nothing to add.
SchemaName = Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")]


class JsonSchemaSpec(Body):
    name: SchemaName = Field(description="the schema's name (1-64 of A-Z, a-z, 0-9, _ and -)")
    # "schema" shadows a BaseModel attribute, hence the alias.
    schema_: dict[str, Any] | None = Field(
        None,
        alias="schema",
        description="JSON schema the reply follows (see docs/api.md); absent or null: any JSON",
    )
    description: Text | None = Field(None, description=IGNORED)
    strict: bool | None = Field(
        None, description="always enforced: the reply follows the schema either way"
    )


class TextFormat(Body):
    type: Literal["text"]


class JsonObjectFormat(Body):
    type: Literal["json_object"]


class JsonSchemaFormat(Body):
    type: Literal["json_schema"]
    json_schema: JsonSchemaSpec


def _format_kind(value: Any) -> str | None:
    kind = value.get("type") if isinstance(value, dict) else None
    return kind if kind in ("text", "json_object", "json_schema") else None


ResponseFormat = Annotated[
    Annotated[TextFormat, Tag("text")]
    | Annotated[JsonObjectFormat, Tag("json_object")]
    | Annotated[JsonSchemaFormat, Tag("json_schema")],
    Discriminator(
        _format_kind,
        custom_error_type=RULE,
        custom_error_message="must have 'type' text, json_object or json_schema",
    ),
]
