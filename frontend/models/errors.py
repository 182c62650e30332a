"""Error reply bodies: the native shape and OpenAI's (every error under ``/v1/``).

A native error is ``{"error": {"type", "message"}}``, with ``reason`` inside ``error`` on a
503 or 429; OpenAI's is ``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

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
