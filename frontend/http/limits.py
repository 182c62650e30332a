"""Limits of this frontend that are not a field's own range: requests in progress
(``--max-connections``) and prompt length in tokens (``--max-prompt-tokens``).

aiohttp has no such setting, so a middleware counts requests in progress (idle keep-alive
connections cost a socket, not a handler, and are not counted). Over the limit a request gets
429 ``frontend_busy`` with ``Retry-After: 1``: a 4xx like every exceeded limit, and not the
node's 503s, since another frontend of the same node may have room; the rendered nginx config
retries a 429 on the next frontend or node at once (``proxy_next_upstream ... http_429``), and
the openai client retries it after ``Retry-After``. The probes and ``/metrics`` are never
counted or refused, so a busy frontend still reports.
"""

from __future__ import annotations

from aiohttp import web
from aiohttp.typedefs import Middleware

from tinyserve.frontend.http.api_errors import ApiError, Handler, too_many

PROMPT_TOO_LONG = "prompt_too_long"  # over --max-prompt-tokens, however large the context
UNCOUNTED = frozenset({"/health", "/ready", "/metrics"})
REASON_FRONTEND_BUSY = "frontend_busy"
BUSY_RETRY_AFTER_S = 1


def check_prompt_limit(prompt_tokens: int, max_prompt_tokens: int) -> None:
    """A prompt longer than ``--max-prompt-tokens`` (0: no such limit) is a 400 naming it;
    checked before the context fit, which is a different error (context_length_exceeded)."""
    if max_prompt_tokens and prompt_tokens > max_prompt_tokens:
        raise ApiError(
            400,
            PROMPT_TOO_LONG,
            f"the prompt has {prompt_tokens} tokens; this server accepts at most "
            f"{max_prompt_tokens} (max_prompt_tokens)",
        )


class InFlight:
    """Requests in progress in this frontend, against a limit (0: none)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.count = 0

    def middleware(self) -> Middleware:
        @web.middleware
        async def limit_requests(request: web.Request, handler: Handler) -> web.StreamResponse:
            if request.path in UNCOUNTED:
                return await handler(request)
            if self.limit and self.count >= self.limit:
                message = f"this frontend is serving its limit of {self.limit} requests"
                raise too_many(REASON_FRONTEND_BUSY, message, BUSY_RETRY_AFTER_S)
            self.count += 1
            try:
                return await handler(request)
            finally:
                self.count -= 1

        return limit_requests
