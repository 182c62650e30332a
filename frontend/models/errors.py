"""Errors: the reply bodies (the native shape, OpenAI's under ``/v1/``, Anthropic's under
``/v1/messages``) and ``ApiError``, the exception that carries one from wherever a request
is refused to the error middleware.

A native error is ``{"error": {"type", "message"}}``, with ``reason`` inside ``error`` on a
503 or 429 (and a ``Retry-After`` header, so a balancer can retry elsewhere and a client
knows when to come back); OpenAI's is ``{"error": {"message", "type", "param", "code"}}``;
Anthropic's is ``{"type": "error", "error": {"type", "message", "code"}, "request_id"}``
(``code`` is ours). The status and headers are the same in every shape.
"""

from __future__ import annotations

from typing import Literal

from aiohttp import web
from pydantic import Field

from tinyserve.frontend.models.common import Reply, is_none, json_response

# Error types (the "type" field); 503 reasons are tinyserve.protocol's REJECT_* and admission's.
INVALID_REQUEST = "invalid_request"
CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
UNSUPPORTED_MEDIA_TYPE = "unsupported_media_type"  # 415: a body that is not said to be JSON
REQUEST_TIMEOUT = "request_timeout"  # 408: the body did not arrive within --body-timeout
SERVICE_UNAVAILABLE = "service_unavailable"
TOO_MANY_REQUESTS = "too_many_requests"  # 429: this frontend's own limit, not the node's
ENGINE_ERROR = "engine_error"
INTERNAL_ERROR = "internal_error"
MODEL_NOT_FOUND = "model_not_found"
NOT_FOUND = "not_found"

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


class ErrorDetail(Reply):
    type: str
    message: str
    reason: str | None = Field(default=None, exclude_if=is_none, description="why a 503 or 429")


class Error(Reply):
    """Every native error reply."""

    error: ErrorDetail


class OpenAIErrorDetail(Reply):
    message: str
    type: str = Field(description="invalid_request_error or server_error")
    param: str | None = Field(description="the request field at fault")
    code: str | None = Field(description="what went wrong (docs/api.md, OpenAI errors)")


class OpenAIError(Reply):
    """Every error under /v1/, and the event that ends a stream that failed."""

    error: OpenAIErrorDetail


class AnthropicErrorDetail(Reply):
    type: str = Field(description="Anthropic's class of error: invalid_request_error, ...")
    message: str = Field(description="what went wrong, naming the field at fault")
    code: str = Field(description="this server's own word for it, as OpenAI errors' code")


class AnthropicError(Reply):
    """Every error under /v1/messages, and the event that ends a stream that failed."""

    type: Literal["error"] = "error"
    error: AnthropicErrorDetail
    request_id: str | None = Field(default=None, exclude_if=is_none)


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


def internal_error() -> ApiError:
    """The 500 of a bug of ours: the client is told no more than that."""
    return ApiError(500, INTERNAL_ERROR, "internal server error")
