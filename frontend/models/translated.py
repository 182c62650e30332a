"""What the surfaces translated into a conversation (Anthropic's Messages, OpenAI's Responses)
share: unions told apart by a ``type`` or by being text or a list, and the conversation's
parts (``conversation``) made from what their own models validated: built as they are, not
validated a second time."""

from __future__ import annotations

from typing import Any

from pydantic import Discriminator

from tinyserve.frontend.models.common import RULE
from tinyserve.frontend.models.conversation import ChatMessage
from tinyserve.frontend.models.response_format import JsonSchemaFormat, JsonSchemaSpec
from tinyserve.frontend.models.tools import (
    CalledFunction,
    FunctionDef,
    FunctionRef,
    NamedToolChoice,
    Tool,
    ToolCallIn,
)

TEXT, LIST = "(text)", "(list)"  # branch tags: ``parse._path`` leaves them out


def type_of(value: Any) -> str | None:
    """The tag of an object in a union of objects: its ``type``, in parentheses (``tag``)."""
    kind = value.get("type") if isinstance(value, dict) else None
    return tag(kind) if isinstance(kind, str) else None


def tag(kind: str) -> str:
    """The tag of a union's branch: in parentheses, no part of the path a 400 names."""
    return f"({kind})"


def _text_or_list(value: Any) -> str | None:
    return TEXT if isinstance(value, str) else LIST if isinstance(value, list) else None


def text_or_list(phrase: str) -> Discriminator:
    """Tells a string (tag ``TEXT``) from a list (``LIST``); anything else is a 400 "must be
    a string or ``phrase``"."""
    return Discriminator(
        _text_or_list, custom_error_type=RULE, custom_error_message=f"must be a string or {phrase}"
    )


def chat_message(
    role: str,
    content: str | None,
    tool_calls: list[ToolCallIn] | None = None,
    tool_call_id: str | None = None,
) -> ChatMessage:
    """A message of the conversation; ``content`` None: an assistant's that only calls tools."""
    return ChatMessage.model_construct(
        role=role, content=content, tool_calls=tool_calls, tool_call_id=tool_call_id
    )


def tool_call(call_id: str, name: str, arguments: str) -> ToolCallIn:
    """A tool call of an earlier assistant turn, its ``arguments`` as JSON text."""
    function = CalledFunction.model_construct(name=name, arguments=arguments)
    return ToolCallIn.model_construct(id=call_id, type="function", function=function)


def function_tool(name: str, description: str | None, parameters: dict[str, Any] | None) -> Tool:
    """A tool the conversation offers: a function, ``parameters`` the JSON schema of its
    arguments."""
    function = FunctionDef.model_construct(
        name=name, description=description, parameters=parameters
    )
    return Tool.model_construct(type="function", function=function)


def named_choice(name: str) -> NamedToolChoice:
    """The tool choice that names the function ``name``."""
    function = FunctionRef.model_construct(name=name)
    return NamedToolChoice.model_construct(type="function", function=function)


def json_schema_format(spec: JsonSchemaSpec) -> JsonSchemaFormat:
    """The response format of JSON that follows ``spec``'s schema."""
    return JsonSchemaFormat.model_construct(type="json_schema", json_schema=spec)
