"""Per-request streams: the engine's ``RequestUpdate``s for one request, in order.

The listener calls ``deliver`` (never waits); the reply awaits ``acknowledged`` and then
takes updates with ``next``. A stream always ends with exactly one update that carries a
``finish_reason``: the engine's, or one made up here when an update went missing (a sequence
gap: ``error``) or the engine went away under the request (``ENGINE_LOST``), so a reply
never waits for an update that will not come.

Updates the reply has not taken yet are merged into one (``RequestUpdate.merge``), so a
client that reads slowly gets fewer, larger updates and its stream holds at most its output,
however many ticks went by. An update's ``text`` ends on a character boundary when it is
taken: the bytes of a character split across updates wait here for the rest, so ``text_of``
(a plain decode) never cuts one, and an incomplete tail left at the end is dropped.
"""

from __future__ import annotations

import asyncio
import codecs
import dataclasses
import logging
from collections.abc import Callable

from tinyserve import protocol
from tinyserve.logs import fields

log = logging.getLogger(__name__)

# A made-up end: the engine died or restarted under the request (a 503 engine_unavailable
# before the reply started; its metrics and log line count it as an error).
ENGINE_LOST = "engine_lost"


def text_of(update: protocol.RequestUpdate) -> str:
    """An update's text, as taken from a stream (whole characters; bytes that are no UTF-8
    at all are U+FFFD)."""
    return update.text.decode("utf-8", "replace")


def _whole(data: bytes) -> int:
    """How many bytes of ``data`` hold whole characters: an incomplete one at the end (at
    most three bytes, its first among them) waits for the rest."""
    if not data or data[-1] < 0x80:
        return len(data)
    tail = data[-3:]
    _, used = codecs.utf_8_decode(tail, "replace", False)
    return len(data) - len(tail) + used


class Inbox:
    """What a reply waits on: woken when there is something to take, or once ``quiet_s``
    seconds passed since it last took something (a keep-alive is due). One timer serves a
    whole quiet spell: it is re-armed when it fires early, not made anew for every wait."""

    def __init__(self) -> None:
        self._waiter: asyncio.Future[None] | None = None
        self._quiet: asyncio.TimerHandle | None = None
        self._taken_at = 0.0  # loop time of the last take (or keep-alive)

    def _ready(self) -> bool:
        raise NotImplementedError

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _wait(self, quiet_s: float) -> bool:
        """Until there is something to take (True) or ``quiet_s`` of quiet passed (False;
        0: no limit)."""
        if self._ready():
            return True
        loop = asyncio.get_running_loop()
        if not self._taken_at:
            self._taken_at = loop.time()
        if quiet_s and self._quiet is None:
            self._quiet = loop.call_at(self._taken_at + quiet_s, self._on_quiet, quiet_s)
        self._waiter = loop.create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None
        ready = self._ready()
        if not ready:
            self._taken_at = loop.time()  # the keep-alive restarts the quiet spell
        return ready

    def _on_quiet(self, quiet_s: float) -> None:
        self._quiet = None
        if self._waiter is None:  # nobody waits (the reply ended): the next wait re-arms
            return
        loop = asyncio.get_running_loop()
        due = self._taken_at + quiet_s
        if loop.time() < due:
            self._quiet = loop.call_at(due, self._on_quiet, quiet_s)
        else:
            self._wake()

    def _taken(self) -> None:
        self._taken_at = asyncio.get_running_loop().time()

    def close(self) -> None:
        """Stop the quiet timer (the reply is done with this inbox)."""
        if self._quiet is not None:
            self._quiet.cancel()
            self._quiet = None


class RequestStream(Inbox):
    """Updates of one request, checked for gaps, merged until taken."""

    def __init__(self, request_id: str) -> None:
        super().__init__()
        self.request_id = request_id
        self.accepted = False
        self.engine_finished = False  # the engine sent this request's final update
        self._closed = False  # its end is here: later updates are ignored
        self._next_seq = 0
        self._pending: protocol.RequestUpdate | None = None  # delivered, not taken yet
        self._failure: protocol.RequestUpdate | None = None  # a made-up end, after those
        self._held = b""  # the start of a character whose rest has not come yet
        self._acknowledged = asyncio.Event()
        self._early: protocol.RequestUpdate | None = None  # an end before acceptance
        self.on_take: Callable[[protocol.RequestUpdate], None] | None = None

    @property
    def pending(self) -> bool:
        """Sent to the engine, neither accepted nor finished yet."""
        return not self._acknowledged.is_set()

    @property
    def queued(self) -> int:
        """Updates ready to be taken: never more than two (the merged output, a failure)."""
        return (self._pending is not None) + (self._failure is not None)

    def deliver(self, update: protocol.RequestUpdate) -> None:
        """Queue one update from the engine; a sequence gap ends the stream with an error."""
        if self._closed:
            return
        if update.seq != self._next_seq:
            detail = f"lost engine output (update {self._next_seq} missing, got {update.seq})"
            log.error("sequence gap", extra=fields(request_id=self.request_id, detail=detail))
            self.fail(detail)
            return
        self._next_seq += 1
        # Accepted and finished may arrive in one update (a short request): accepted first.
        if update.token_ids or update.text or update.accepted:
            self.accepted = True
        if update.finish_reason is not None:
            self.engine_finished = self._closed = True
            if not self.accepted:
                self._early = update
        pending = self._pending
        self._pending = update if pending is None else pending.merge(update)
        self._wake()
        if self.accepted or self._closed:
            self._acknowledged.set()

    def fail(self, detail: str, *, lost: bool = False) -> None:
        """End the stream with an error that did not come from the engine's own output (the
        engine may still hold the request: ``engine_finished`` stays False); ``lost``: the
        engine went away."""
        if self._closed:
            return
        self._closed = True
        reason = ENGINE_LOST if lost else protocol.FINISH_ERROR
        end = protocol.RequestUpdate(self.request_id, -1, finish_reason=reason, detail=detail)
        if not self.accepted:
            self._early = end
        self._failure = end
        self._wake()
        self._acknowledged.set()

    async def acknowledged(self) -> protocol.RequestUpdate | None:
        """Wait until the engine accepted the request or it ended; returns the end when it
        came before acceptance (rejected, failed), so the reply can still be an HTTP error."""
        await self._acknowledged.wait()
        return self._early

    async def next(self, quiet_s: float = 0.0) -> protocol.RequestUpdate | None:
        """Every update delivered since the last call, merged; None when ``quiet_s`` seconds
        passed without one (a keep-alive is due). The one with a ``finish_reason`` is last."""
        if not await self._wait(quiet_s):
            return None
        pending, self._pending = self._pending, None
        update = self._failure if pending is None else pending
        if pending is None:
            self._failure = None
        assert update is not None
        if update.finish_reason is not None:
            self.close()
        update = self._whole_characters(update)
        self._taken()
        if self.on_take is not None:
            self.on_take(update)
        return update

    def _ready(self) -> bool:
        return self._pending is not None or self._failure is not None

    def _whole_characters(self, update: protocol.RequestUpdate) -> protocol.RequestUpdate:
        data = self._held + update.text if self._held else update.text
        cut = _whole(data)
        if update.finish_reason is None:
            self._held = data[cut:]
        elif cut < len(data):
            # Output cut mid-character (max_tokens, cancel): dropping the incomplete tail
            # beats ending the text with U+FFFD.
            log.debug("dropping incomplete UTF-8 tail",
                      extra=fields(request_id=self.request_id, bytes=len(data) - cut))  # fmt: skip
        if data is update.text and cut == len(data):
            return update
        return dataclasses.replace(update, text=data[:cut])
