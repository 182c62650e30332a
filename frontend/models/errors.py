"""Error reply bodies: the native shape, OpenAI's (every error under ``/v1/``) and
Anthropic's (under ``/v1/messages``).

A native error is ``{"error": {"type", "message"}}``, with ``reason`` inside ``error`` on a
503 or 429; OpenAI's is ``{"error": {"message", "type", "param", "code"}}``; Anthropic's is
``{"type": "error", "error": {"type", "message", "code"}, "request_id"}`` (``code`` is ours).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from tinyserve.frontend.models.common import Reply, is_none


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
