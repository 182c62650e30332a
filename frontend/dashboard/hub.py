"""The event feed's fan-out in one frontend: the engine's updates to every SSE viewer.

The first viewer subscribes this frontend to the feed's topic and leases the feed from the
engine (``FeedLease``); viewers' handlers renew the lease at most every ``RENEW_S`` while any
stays; the last one to leave unsubscribes and ends the lease at once. A frontend that dies
stops renewing, so the engine stops producing within ``LEASE_S``.

Each update is encoded to one SSE frame once and offered to every viewer's bounded queue
without waiting: a viewer whose queue is full (it reads slower than the feed comes) is cut
off, its queue replaced by one ``None`` that tells its handler to end the stream. Neither
the engine nor the other viewers ever wait for a slow one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from typing import Any

from aiohttp import web

from tinyserve import feed_protocol
from tinyserve.frontend.link.engine_client import EngineClient, EngineUnreachable

log = logging.getLogger(__name__)

LEASE_S = 5.0  # the engine produces this long after the last renewal
# Renewed when a viewer's handler wakes (a frame, or RENEW_S without one) and RENEW_S has
# passed: at most 2 s apart, so a frontend or engine stalled for 3 s still keeps its lease
# (a lapse drops the events of the ticks until the next renewal).
RENEW_S = 1.0
QUEUE_UPDATES = 50  # per viewer: five seconds of updates at the engine's 10 a second


def sse_frame(event: str, data: dict[str, Any]) -> bytes:
    """One server-sent event with a JSON ``data`` line."""
    body = json.dumps(data, separators=(",", ":"), allow_nan=False)
    return f"event: {event}\ndata: {body}\n\n".encode()


class Viewer:
    """One SSE viewer: its queue of encoded frames; ``None`` in it means it was cut off."""

    def __init__(self, size: int) -> None:
        self.queue: asyncio.Queue[bytes | None] = asyncio.Queue(size)
        self.cut = False

    def offer(self, frame: bytes) -> None:
        if self.cut:
            return
        try:
            self.queue.put_nowait(frame)
        except asyncio.QueueFull:
            self.cut = True
            while not self.queue.empty():
                self.queue.get_nowait()
            self.queue.put_nowait(None)


class FeedHub:
    """The viewers of this frontend and its lease on the engine's feed."""

    def __init__(self, queue_updates: int = QUEUE_UPDATES) -> None:
        self._queue_updates = queue_updates
        self._viewers: set[Viewer] = set()
        self._client: EngineClient | None = None
        self._renewed = 0.0
        self.updates = 0  # received since start (tests, logs)

    @property
    def viewers(self) -> int:
        return len(self._viewers)

    def join(self, client: EngineClient) -> Viewer:
        """A new viewer; the first one switches the feed on."""
        viewer = Viewer(self._queue_updates)
        if not self._viewers:
            self._client = client
            client.watch_feed(self.publish)
            self._renewed = 0.0
        self._viewers.add(viewer)
        self.renew()
        return viewer

    def leave(self, viewer: Viewer) -> None:
        """A viewer left (or was cut off); the last one switches the feed off."""
        self._viewers.discard(viewer)
        if self._viewers or self._client is None:
            return
        self._client.watch_feed(None)
        self._send_lease(0.0)
        self._client = None

    def renew(self) -> None:
        """Renew the lease if ``RENEW_S`` passed since the last renewal; any viewer may call
        it, one renewal goes out."""
        now = time.monotonic()
        if self._viewers and now - self._renewed >= RENEW_S:
            self._renewed = now
            self._send_lease(LEASE_S)

    def _send_lease(self, seconds: float) -> None:
        assert self._client is not None
        # The engine is down or restarting: the next renewal reaches the new one.
        with contextlib.suppress(EngineUnreachable):
            self._client.send(feed_protocol.FeedLease(self._client.frontend_id, seconds))

    def publish(self, update: feed_protocol.FeedUpdate) -> None:
        """Offer one engine update to every viewer, encoded once; never waits."""
        self.updates += 1
        frame = sse_frame("update", update_body(update))
        for viewer in list(self._viewers):
            viewer.offer(frame)


def update_body(update: feed_protocol.FeedUpdate) -> dict[str, Any]:
    """An update as viewers get it: the message's fields by name."""
    return {
        "seq": update.seq,
        "at_ms": update.at_ns / 1e6,
        "window_s": update.window_s,
        "tick": update.tick,
        "ticks": update.ticks,
        "batch": update.batch,
        "slots": update.slots,
        "queue": update.queue,
        "kv": update.kv,
        "events": update.events,
        "policy": update.policy,
        "embed_queue": update.embed_queue,
    }


FEED_HUB = web.AppKey("feed_hub", FeedHub)
