"""HTTP error replies: one JSON shape for every error, ours and aiohttp's own.

Every error body is ``{"error": {"type": ..., "message": ...}}``; a 503 adds ``"reason"``
inside ``error`` and a ``Retry-After`` header, so a balancer (nginx) can retry elsewhere and a
client knows when to come back.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from aiohttp import web

from tinyserve.logs import fields

log = logging.getLogger(__name__)

# Error types (the "type" field); 503 reasons live in tinyserve.protocol (REJECT_*) plus these.
INVALID_REQUEST = "invalid_request"
CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
SERVICE_UNAVAILABLE = "service_unavailable"
ENGINE_ERROR = "engine_error"
INTERNAL_ERROR = "internal_error"
REASON_ENGINE_UNAVAILABLE = "engine_unavailable"

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
    ) -> None:
        super().__init__(message)
        self.status = status
        self.type = type_
        self.message = message
        self.reason = reason
        self.retry_after = retry_after
        self.request_id: str | None = None  # set once the request was given an id

    def body(self) -> dict[str, dict[str, str]]:
        """The JSON body of this error."""
        error = {"type": self.type, "message": self.message}
        if self.reason is not None:
            error["reason"] = self.reason
        return {"error": error}

    def response(self) -> web.Response:
        """This error as an aiohttp response."""
        headers: dict[str, str] = {}
        if self.retry_after is not None:
            headers["Retry-After"] = str(self.retry_after)
        if self.request_id is not None:
            headers["X-Request-Id"] = self.request_id
        return web.json_response(self.body(), status=self.status, headers=headers)


def invalid(message: str) -> ApiError:
    """A 400 for input that does not follow the API."""
    return ApiError(400, INVALID_REQUEST, message)


def too_long(message: str) -> ApiError:
    """A 400 for a request that can never fit the engine, however long the client waits."""
    return ApiError(400, CONTEXT_LENGTH_EXCEEDED, message)


def unavailable(reason: str, message: str, retry_after: int) -> ApiError:
    """A 503: the request was fine, the node cannot take it now."""
    return ApiError(503, SERVICE_UNAVAILABLE, message, reason=reason, retry_after=retry_after)


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Turn ``ApiError`` and aiohttp's own HTTP errors into the JSON error shape."""
    try:
        return await handler(request)
    except ApiError as exc:
        return exc.response()
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return _from_http_exception(exc)
    except Exception:
        # A bug of ours: the client still gets the JSON shape, the log gets the traceback.
        log.exception("unhandled error", extra=fields(path=request.path))
        return ApiError(500, INTERNAL_ERROR, "internal server error").response()


def _from_http_exception(exc: web.HTTPException) -> web.Response:
    type_ = _HTTP_TYPES.get(exc.status, INVALID_REQUEST if exc.status < 500 else INTERNAL_ERROR)
    body = {"error": {"type": type_, "message": exc.reason}}
    # Allow (405) and similar headers stay meaningful; the content type is ours.
    headers = {k: v for k, v in exc.headers.items() if k.lower() not in {"content-type"}}
    headers.pop("Content-Length", None)
    return web.json_response(body, status=exc.status, headers=headers)
