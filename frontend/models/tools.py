"""Tool-calling fields of ``POST /v1/chat/completions`` (OpenAI's shapes): the tools a request
offers, its ``tool_choice``, and the tool calls an assistant message carries; and a reply's
tool call (``ToolCall``), as the reply parser reads it for every surface (Messages and
Responses write it in their own shapes)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from tinyserve.frontend.models.common import IGNORED, Body, Reply, Text

# str, not Text: pydantic leaves a pattern placed after a validator out of the document.
FunctionName = Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")]


class FunctionDef(Body):
    name: FunctionName = Field(description="1-64 of A-Z, a-z, 0-9, _, . and -")
    description: Text | None = Field(None, description="shown to the model")
    parameters: dict[str, Any] | None = Field(
        None, description="JSON schema of the arguments (enforced when a call is made)"
    )
    strict: bool | None = Field(None, description="always enforced")


class Tool(Body):
    type: Literal["function"]
    function: FunctionDef


class FunctionRef(Body):
    name: FunctionName


class NamedToolChoice(Body):
    type: Literal["function"]
    function: FunctionRef


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class CalledFunction(Body):
    name: Text
    arguments: Text = Field(description="the arguments as JSON text")
    # The openai client's parse() puts the arguments, parsed, beside them.
    parsed_arguments: Any = Field(None, description=IGNORED)


class ToolCallIn(Body):
    """A tool call of an earlier assistant turn, sent back with the conversation."""

    id: Text
    type: Literal["function"]
    function: CalledFunction
    index: Any = Field(None, description=IGNORED)


class FunctionCall(Reply):
    name: str
    arguments: str = Field(description="the arguments as JSON text")


class ToolCall(Reply):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall
