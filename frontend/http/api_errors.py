"""HTTP error replies: one JSON shape per API surface, for our errors and aiohttp's own.

A native error body is ``{"error": {"type": ..., "message": ...}}``; a 503 or 429 adds
``"reason"`` inside ``error`` and a ``Retry-After`` header, so a balancer (nginx) can retry
elsewhere and a client knows when to come back. Under ``/v1/`` the body follows OpenAI's
shape instead, ``{"error": {"message", "type", "param", "code"}}``, and under
``/v1/messages`` Anthropic's, ``{"type": "error", "error": {"type", "message", "code"}}``,
with the same status and headers.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Literal

from aiohttp import web

from tinyserve.frontend.models.common import json_response
from tinyserve.frontend.models.errors import (
    AnthropicError,
    AnthropicErrorDetail,
    Error,
    ErrorDetail,
    OpenAIError,
    OpenAIErrorDetail,
)
from tinyserve.logs import fields

log = logging.getLogger(__name__)

# Error types (the "type" field); 503 reasons live in tinyserve.protocol (REJECT_*) plus these.
INVALID_REQUEST = "invalid_request"
CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
UNSUPPORTED_MEDIA_TYPE = "unsupported_media_type"  # 415: a body that is not said to be JSON
REQUEST_TIMEOUT = "request_timeout"  # 408: the body did not arrive within --body-timeout
SERVICE_UNAVAILABLE = "service_unavailable"
TOO_MANY_REQUESTS = "too_many_requests"  # 429: this frontend's own limit, not the node's
ENGINE_ERROR = "engine_error"
INTERNAL_ERROR = "internal_error"
REASON_ENGINE_UNAVAILABLE = "engine_unavailable"
MODEL_NOT_FOUND = "model_not_found"

# The status recorded (never sent) for a client that closed before its reply: nginx's 499.
CLIENT_CLOSED = 499

# The status of a reply whose headers went out before its body was done (an event stream).
HEADERS_SENT = web.RequestKey("headers_sent", int)


def status_when_gone(request: web.Request) -> int:
    """The status to record for ``request`` when its client went away: the one its headers
    carried if they went out (a stream cut short was still a 200), else ``CLIENT_CLOSED``."""
    sent: int = request.get(HEADERS_SENT, CLIENT_CLOSED)
    return sent


# Paths whose errors take OpenAI's shape, and within them those that take Anthropic's.
OPENAI_PREFIX = "/v1/"
ANTHROPIC_PATH = "/v1/messages"
# The error body an API surface answers with.
Shape = Literal["native", "openai", "anthropic"]
# Anthropic's class of error by status (its API's error types); others are invalid requests
# (4xx) or api_error (5xx).
_ANTHROPIC_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    504: "timeout_error",
}

# aiohttp raises these itself (unknown route, wrong method, body over client_max_size).
_HTTP_TYPES = {
    404: "not_found",
    405: "method_not_allowed",
    413: "request_too_large",
}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class ApiError(Exception):
    """A request that ends with an HTTP error reply; raised anywhere below a handler."""

    def __init__(
        self,
        status: int,
        type_: str,
        message: str,
        *,
        reason: str | None = None,
        retry_after: int | None = None,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.type = type_
        self.message = message
        self.reason = reason
        self.retry_after = retry_after
        self.param = param  # the request field at fault, when one is
        self.headers = headers or {}
        self.request_id: str | None = None  # set once the request was given an id

    def body(self) -> Error:
        """The JSON body of this error."""
        return Error(error=ErrorDetail(type=self.type, message=self.message, reason=self.reason))

    def openai_body(self) -> OpenAIError:
        """This error in OpenAI's shape: ``type`` is OpenAI's class of error, ``code`` our
        precise type (or the 503 reason), ``param`` the field at fault."""
        type_ = "invalid_request_error" if self.status < 500 else "server_error"
        code = self.reason or self.type
        detail = OpenAIErrorDetail(message=self.message, type=type_, param=self.param, code=code)
        return OpenAIError(error=detail)

    def anthropic_body(self) -> AnthropicError:
        """This error in Anthropic's shape: ``type`` is Anthropic's class of error for the
        status, ``code`` our precise type (or the 503 reason) as in OpenAI's shape; the
        message names the field at fault, as every message of ours does."""
        default = "invalid_request_error" if self.status < 500 else "api_error"
        kind = _ANTHROPIC_TYPES.get(self.status, default)
        detail = AnthropicErrorDetail(
            type=kind, message=self.message, code=self.reason or self.type
        )
        return AnthropicError(error=detail, request_id=self.request_id)

    def response(self, shape: Shape = "native") -> web.Response:
        """This error as an aiohttp response, in the shape of an API surface."""
        headers = dict(self.headers)
        if self.retry_after is not None:
            headers["Retry-After"] = str(self.retry_after)
        if self.request_id is not None:
            headers["X-Request-Id"] = self.request_id
        bodies = {"native": self.body, "openai": self.openai_body, "anthropic": self.anthropic_body}
        return json_response(bodies[shape](), status=self.status, headers=headers)


def invalid(message: str, param: str | None = None) -> ApiError:
    """A 400 for input that does not follow the API; ``param`` names the field at fault."""
    return ApiError(400, INVALID_REQUEST, message, param=param)


def too_long(message: str, param: str) -> ApiError:
    """A 400 for a request that can never fit the engine, however long the client waits;
    ``param`` names the field that holds its prompt."""
    return ApiError(400, CONTEXT_LENGTH_EXCEEDED, message, param=param)


def too_many(reason: str, message: str, retry_after: int) -> ApiError:
    """A 429: the request was fine, this frontend has as many in progress as it may hold."""
    return ApiError(429, TOO_MANY_REQUESTS, message, reason=reason, retry_after=retry_after)


def unavailable(reason: str, message: str, retry_after: int) -> ApiError:
    """A 503: the request was fine, the node cannot take it now."""
    return ApiError(503, SERVICE_UNAVAILABLE, message, reason=reason, retry_after=retry_after)


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Turn ``ApiError`` and aiohttp's own HTTP errors into the JSON error shape of the path."""
    shape = shape_of(request.path)
    try:
        return await handler(request)
    except ApiError as exc:
        return exc.response(shape)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return _from_http_exception(exc).response(shape)
    except Exception:
        # A bug of ours: the client still gets the JSON shape, the log gets the traceback.
        log.exception("unhandled error", extra=fields(path=request.path))
        return ApiError(500, INTERNAL_ERROR, "internal server error").response(shape)


def shape_of(path: str) -> Shape:
    """The error shape of the surface ``path`` belongs to."""
    if path == ANTHROPIC_PATH or path.startswith(ANTHROPIC_PATH + "/"):
        return "anthropic"
    return "openai" if path.startswith(OPENAI_PREFIX) else "native"


def _from_http_exception(exc: web.HTTPException) -> ApiError:
    type_ = _HTTP_TYPES.get(exc.status, INVALID_REQUEST if exc.status < 500 else INTERNAL_ERROR)
    # Allow (405) and similar headers stay meaningful; the content type and length are ours.
    skip = {"content-type", "content-length"}
    headers = {k: v for k, v in exc.headers.items() if k.lower() not in skip}
    # 413's text names the limit ("Maximum request body size N exceeded, ..."); keep it.
    message = (exc.text or exc.reason) if exc.status == 413 else exc.reason
    return ApiError(exc.status, type_, message, headers=headers)
