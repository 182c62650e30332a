"""The ``messages`` of a chat completions request: checked and turned into ``ChatMessage``s.

Roles: system, user, assistant, and ``developer`` (OpenAI's newer name for system) taken as
system. Content: a string, or a list of text parts joined by newlines; other part types, tool
calls and the tool role are features this server does not have, so they are 400s.
"""

from __future__ import annotations

from typing import Any

from tinyserve.frontend.api_errors import invalid
from tinyserve.frontend.chat_template import ROLES, ChatMessage
from tinyserve.frontend.validation import encodable

ROLE_ALIASES = {"developer": "system"}
MESSAGE_FIELDS = frozenset({"role", "content", "name"})
# Message fields of features we lack, accepted while empty (clients echo them back as null).
MESSAGE_EMPTY_ONLY = frozenset({"tool_calls", "function_call", "tool_call_id", "refusal", "audio"})


def parse_messages(value: Any) -> list[ChatMessage]:
    """Check ``messages``; raises a 400 naming the message and field at fault."""
    if not isinstance(value, list) or not value:
        raise invalid("'messages' must be a non-empty list of messages", "messages")
    return [_message(f"messages[{i}]", item) for i, item in enumerate(value)]


def _message(where: str, item: Any) -> ChatMessage:
    if not isinstance(item, dict):
        raise invalid(f"{where!r} must be an object", where)
    for key, value in item.items():
        if key not in MESSAGE_FIELDS and not (key in MESSAGE_EMPTY_ONLY and _is_empty(value)):
            raise invalid(f"'{where}.{key}' is not supported", f"{where}.{key}")
    role = _role(f"{where}.role", item.get("role"))
    content = _content(f"{where}.content", item.get("content"), role)
    name = item.get("name")
    if name is not None and not isinstance(name, str):
        raise invalid(f"'{where}.name' must be a string", f"{where}.name")
    return ChatMessage(role, content, name)


def _is_empty(value: Any) -> bool:
    # Not any falsy value: 0 and false are not how a client spells "none".
    return value is None or (type(value) in (str, list, dict) and not value)


def _role(where: str, value: Any) -> str:
    role = ROLE_ALIASES.get(value, value) if isinstance(value, str) else None
    if role is None or role not in ROLES:
        raise invalid(
            f"{where!r} must be one of {', '.join(ROLES)} (or developer, taken as system)", where
        )
    return role


def _content(where: str, value: Any, role: str) -> str:
    if value is None and role == "assistant":
        return ""  # an assistant turn that only called tools, as clients replay it
    if isinstance(value, str):
        return encodable(where, value)
    if isinstance(value, list) and value:
        return "\n".join(_text_part(f"{where}[{i}]", part) for i, part in enumerate(value))
    raise invalid(f"{where!r} must be a string or a non-empty list of text parts", where)


def _text_part(where: str, part: Any) -> str:
    if not isinstance(part, dict) or part.get("type") != "text":
        raise invalid(f"{where!r}: only parts of type 'text' are supported", where)
    text = part.get("text")
    if not isinstance(text, str) or set(part) - {"type", "text"}:
        raise invalid(f"{where!r} must be {{'type': 'text', 'text': <string>}}", where)
    return encodable(where, text)
