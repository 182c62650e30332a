"""From a request's bytes to its model, or to a 400 that names the field at fault.

The body gate comes first: a ``Content-Type`` that is not JSON is a 415; the body must be a
JSON object in UTF-8 with no key given twice (neither pydantic's JSON parser nor msgspec's
refuses one, so Python's own reads the body). Then the model validates it, and the first
error becomes the 400: a feature we lack is reported before a bad value, since it says more
about what went wrong. What the body holds
that this server ignores (``common.ignored_fields``) is noted on the request
(``IGNORED_FIELDS``), for the reply's header, the log and the metric (``request.notices``).
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any, TypeVar

from aiohttp import hdrs, web
from pydantic import BaseModel, ValidationError

from tinyserve.config import Config
from tinyserve.frontend.models.common import CROSS_FIELD, UNSUPPORTED, ignored_fields
from tinyserve.frontend.models.errors import (
    REQUEST_TIMEOUT,
    UNSUPPORTED_MEDIA_TYPE,
    ApiError,
    invalid,
)

M = TypeVar("M", bound=BaseModel)

# A request's key: the paths of what it held that was ignored.
IGNORED_FIELDS = web.RequestKey("ignored_fields", list[str])

_REPORTED_FIRST = frozenset({"extra_forbidden", UNSUPPORTED})
# pydantic's own messages as a rule of the field: "Input should be a valid boolean" ->
# "'stream' must be a valid boolean"; "List should have at least 1 item after validation" ->
# "'messages' must have at least 1 item".
_SUBJECT = re.compile(r"^\w+ should")
# pydantic names the model class here, which means nothing to a client.
_NOT_AN_OBJECT = frozenset({"model_type", "model_attributes_type", "dict_type"})


async def read_body(request: web.Request, model: type[M], config: Config) -> M:
    """The body of ``request`` as ``model`` (``parse_body``); what it
    holds that is ignored is noted on ``request``."""
    body = parse_body(await json_body(request, config.body_timeout), model)
    ignored = ignored_fields(body)
    if ignored:
        request[IGNORED_FIELDS] = ignored
    return body


async def json_body(request: web.Request, timeout_s: float) -> bytes:
    """The body of a request that says it is JSON, or says nothing; any other Content-Type is a
    415. Browsers send forms and text/plain across sites without asking (no CORS preflight), so
    a JSON-only API refusing them cannot be driven by a page the user happens to visit. A body
    that has not arrived within ``--body-timeout`` is a 408 and the connection is closed: a
    client that sends half a body and waits must not hold a request's place forever."""
    if hdrs.CONTENT_TYPE in request.headers:
        media = request.content_type.lower()
        if media != "application/json" and not (
            media.startswith("application/") and media.endswith("+json")
        ):
            message = f"Content-Type must be application/json, not {media!r}"
            raise ApiError(415, UNSUPPORTED_MEDIA_TYPE, message)
    try:
        return await asyncio.wait_for(request.read(), timeout_s or None)
    except TimeoutError:
        message = f"the request body did not arrive within {timeout_s:g} s (body_timeout)"
        raise ApiError(408, REQUEST_TIMEOUT, message, headers={"Connection": "close"}) from None


def parse_body(body: bytes, model: type[M]) -> M:
    """``body`` as ``model``; raises a 400 ``ApiError`` naming the field at fault."""
    data = load_object(body)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise api_error(exc) from None


def load_object(body: bytes) -> dict[str, Any]:
    """The JSON object of ``body``; anything else is a 400."""
    try:
        data = json.loads(body, object_pairs_hook=_unique_keys)
    # RecursionError: a deeply nested body must be a 400, not a crash of the handler.
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise invalid(f"body is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise invalid("body must be a JSON object")
    return data


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # A key given twice may be read as its first value by a proxy that checked it and as its
    # last one here (Python's default); refusing the body leaves no such gap (RFC 7493 2.3).
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            raise ValueError(f"duplicate key {key!r}")
        seen.add(key)
    return dict(pairs)


def api_error(exc: ValidationError) -> ApiError:
    """The 400 for the error of ``exc`` to report first."""
    errors = exc.errors(include_url=False, include_input=False)
    error = min(errors, key=lambda e: e["type"] not in _REPORTED_FIRST)
    kind, loc, message = error["type"], error["loc"], error["msg"]
    if kind == "extra_forbidden":
        # An unknown key is named in full; the parameter at fault is the object holding it.
        holder = _path(loc[:-1])
        name = f"{holder}.{loc[-1]}" if holder else str(loc[-1])
        return invalid(f"unknown field {name!r}", holder or name)
    if kind == CROSS_FIELD:
        field = (error.get("ctx") or {})["field"]
        param = _path((*loc, field))
        return invalid(message.replace(repr(field), repr(param), 1), param)
    param = _path(loc)
    if kind == "missing":
        return invalid(f"{param!r} is required", param)
    if kind == UNSUPPORTED:
        return ApiError(400, UNSUPPORTED, f"{param!r} {message}", param=param)
    if kind in _NOT_AN_OBJECT:
        return invalid(f"{param!r} must be an object", param)
    rule = _SUBJECT.sub("must", message.replace(" after validation", ""))
    return invalid(f"{param!r} {rule}", param)


def _path(loc: tuple[int | str, ...]) -> str:
    """``('messages', 0, 'content', '(parts)', 0)`` -> ``messages[0].content[0]``: the tag of
    a union's branch, in parentheses, is no part of the path in the body."""
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif not part.startswith("("):
            path += f".{part}" if path else part
    return path
