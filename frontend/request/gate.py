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
reports. ``/ready`` is refused while draining, and never counted (``http.middlewares``). The
refusals themselves are ``admission``'s.
"""

from __future__ import annotations

import asyncio

from tinyserve.frontend.request import admission


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
            raise admission.frontend_draining()

    def enter(self) -> None:
        """Count a request in, or raise its refusal."""
        self.refuse_if_draining()
        if self.limit and self._in_progress >= self.limit:
            raise admission.Busy(self.limit)
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
