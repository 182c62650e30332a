"""Who may come in: one count of the requests in progress in this frontend, against which
both the in-flight limit and the drain decide.

- **In-flight limit** (``--max-connections``, 0: none). aiohttp has no such setting, so the
  gate counts requests in progress (idle keep-alive connections cost a socket, not a handler,
  and are not counted). Over the limit a request gets 429 ``frontend_busy`` with
  ``Retry-After: 1``: a 4xx like every exceeded limit, and not the node's 503s, since another
  frontend of the same node may have room; the rendered nginx config retries a 429 on the next
  frontend or node at once (``proxy_next_upstream ... http_429``), and the openai client
  retries it after ``Retry-After``.
- **Drain** (SIGTERM): ``/ready`` and every new request get a 503 with reason ``draining``
  and ``Retry-After: 1``; a balancer (nginx) retries them on another frontend at once, and one
  that polls ``/ready`` takes this one out of rotation. Requests that arrived before keep
  running until they end or ``drain_timeout`` passes; then their streams end with an error
  event, never a silent close.

``/health`` and ``/metrics`` always pass, uncounted: a busy or draining frontend still
reports. ``/ready`` is refused while draining, and never counted.
"""

from __future__ import annotations

import asyncio
import logging

from aiohttp import web
from aiohttp.typedefs import Middleware

from tinyserve.frontend.http.api_errors import Handler, too_many, unavailable
from tinyserve.frontend.http.appkeys import CLIENT
from tinyserve.logs import fields
from tinyserve.protocol import REJECT_DRAINING

log = logging.getLogger(__name__)

ALWAYS_ANSWERED = frozenset({"/health", "/metrics"})
PROBE = "/ready"
REASON_FRONTEND_BUSY = "frontend_busy"
RETRY_AFTER_S = 1  # another frontend can take the request right away


class Gate:
    """Requests in progress, against ``limit``; once ``begin_drain`` is called, none new."""

    def __init__(self, limit: int = 0) -> None:
        self.limit = limit
        self.draining = False
        self._in_progress = 0
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def in_progress(self) -> int:
        return self._in_progress

    def begin_drain(self) -> None:
        self.draining = True

    def refuse_if_draining(self) -> None:
        if self.draining:
            raise unavailable(REJECT_DRAINING, "frontend is shutting down", RETRY_AFTER_S)

    def enter(self) -> None:
        """Count a request in, or raise its refusal."""
        self.refuse_if_draining()
        if self.limit and self._in_progress >= self.limit:
            message = f"this frontend is serving its limit of {self.limit} requests"
            raise too_many(REASON_FRONTEND_BUSY, message, RETRY_AFTER_S)
        self._in_progress += 1
        self._idle.clear()

    def leave(self) -> None:
        self._in_progress -= 1
        if self._in_progress == 0:
            self._idle.set()

    async def wait_idle(self, timeout_s: float) -> bool:
        """True once no request is in progress, False if ``timeout_s`` passed first."""
        if self._idle.is_set():
            return True
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        except TimeoutError:
            return False
        return True

    def middleware(self) -> Middleware:
        @web.middleware
        async def gate(request: web.Request, handler: Handler) -> web.StreamResponse:
            if request.path in ALWAYS_ANSWERED:
                return await handler(request)
            if request.path == PROBE:
                self.refuse_if_draining()
                return await handler(request)
            self.enter()
            try:
                return await handler(request)
            finally:
                self.leave()

        return gate


GATE = web.AppKey("gate", Gate)


async def drain_app(app: web.Application, timeout_s: float) -> None:
    """Refuse new requests now and wait up to ``timeout_s`` for those in progress; streams
    still open after that end with an error event (their handlers then cancel them in the
    engine)."""
    gate = app[GATE]
    gate.begin_drain()
    log.info("draining", extra=fields(in_progress=gate.in_progress, timeout_s=timeout_s))
    if await gate.wait_idle(timeout_s):
        return
    log.warning("drain timeout: ending open streams", extra=fields(open=gate.in_progress))
    app[CLIENT].fail_all("frontend shutting down: drain timeout reached")
