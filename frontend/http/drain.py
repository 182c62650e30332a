"""Graceful drain of one frontend: on SIGTERM refuse new work at once, let in-flight work end.

While draining, ``/ready`` and every new request (``/health`` and ``/metrics`` excepted) get a
503 with reason ``draining`` and ``Retry-After: 1``: a balancer (nginx) retries them on another
frontend at once, and one that polls ``/ready`` takes this one out of rotation. Requests that
arrived before keep running until they end or ``drain_timeout`` passes; then their streams
end with an error event, never a silent close.
"""

from __future__ import annotations

import asyncio
import logging

from aiohttp import web

from tinyserve.frontend.http.api_errors import Handler, unavailable
from tinyserve.frontend.http.appkeys import CLIENT
from tinyserve.logs import fields
from tinyserve.protocol import REJECT_DRAINING

log = logging.getLogger(__name__)

# Answered while draining: the process is alive, and metrics of the drain are worth scraping.
STILL_ANSWERED = frozenset({"/health", "/metrics"})
DRAIN_RETRY_AFTER_S = 1  # another frontend can take the request right away


class Drain:
    """Counts requests in progress; once ``begin`` is called, new ones are refused."""

    def __init__(self) -> None:
        self.draining = False
        self._in_progress = 0
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def in_progress(self) -> int:
        return self._in_progress

    def begin(self) -> None:
        self.draining = True

    def enter(self) -> None:
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


DRAIN = web.AppKey("drain", Drain)


@web.middleware
async def drain_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Refuse new requests while draining; count the others so the drain can wait for them."""
    drain = request.app[DRAIN]
    if request.path in STILL_ANSWERED:
        return await handler(request)
    if drain.draining:
        raise unavailable(REJECT_DRAINING, "frontend is shutting down", DRAIN_RETRY_AFTER_S)
    drain.enter()
    try:
        return await handler(request)
    finally:
        drain.leave()


async def drain_app(app: web.Application, timeout_s: float) -> None:
    """Refuse new requests now and wait up to ``timeout_s`` for those in progress; streams
    still open after that end with an error event (their handlers then cancel them in the
    engine)."""
    drain = app[DRAIN]
    drain.begin()
    log.info("draining", extra=fields(in_progress=drain.in_progress, timeout_s=timeout_s))
    if await drain.wait_idle(timeout_s):
        return
    log.warning("drain timeout: ending open streams", extra=fields(open=drain.in_progress))
    app[CLIENT].fail_all("frontend shutting down: drain timeout reached")
