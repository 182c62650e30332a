"""What the surfaces that are translated into a chat completion request (Anthropic's
Messages, OpenAI's Responses) share: unions told apart by a ``type`` or by being text or a
list, and the chat request made from the translated fields."""

from __future__ import annotations

from typing import Any

from pydantic import Discriminator, ValidationError

from tinyserve.frontend.models.chat import ChatCompletionRequest
from tinyserve.frontend.models.common import RULE
from tinyserve.frontend.models.fields import Sampling
from tinyserve.frontend.models.parse import api_error

TEXT, LIST = "(text)", "(list)"  # branch tags: ``parse._path`` leaves them out
_SAMPLING = frozenset(Sampling.model_fields)


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


def sampling_fields(req: Sampling) -> dict[str, Any]:
    """The sampling fields ``req`` gives; those it leaves out stay out of the chat request,
    so that the serve-side defaults apply to them."""
    return {name: getattr(req, name) for name in req.model_fields_set & _SAMPLING}


def chat_request(fields: dict[str, Any]) -> ChatCompletionRequest:
    """``fields`` as a chat completion request; a rule of chat's that the translated request
    broke (a tool named twice, a tool choice naming none of the tools) is its 400."""
    try:
        return ChatCompletionRequest.model_validate(fields)
    except ValidationError as exc:
        raise api_error(exc) from None
