"""The ZeroMQ side of the frontend: PUSH requests to the engine, SUB to this frontend's topic.

One ``EngineClient`` per process. Sends never wait: the PUSH socket is a plain (non-asyncio)
socket used with ``NOBLOCK`` and ``IMMEDIATE``, so "the engine is not connected" surfaces at
once as ``EngineUnreachable`` (a 503) instead of a request parked in a queue nobody reads.
The ``listen`` coroutine, run as a task by the app's ``cleanup_ctx``, routes every
``RequestUpdate`` to its request's stream and hands ``HelloAck``s to a pending handshake.

The SUB socket is a plain one too, read from the event loop's reader callback: each time its
descriptor signals, the callback takes every message waiting (ZeroMQ's descriptor is
edge-triggered, so a wake-up must drain the socket). pyzmq's asyncio socket made a future,
a callback and a readiness check per message: without it the frontends' CPU per streamed
token fell from 0.62 to 0.54 ms (docs/benchmarks.md, "Where one stream's time goes").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import uuid
from collections.abc import Callable
from typing import Any, cast

import zmq

from tinyserve import feed_protocol, protocol
from tinyserve.config import Config
from tinyserve.frontend.link.streams import ENGINE_LOST, RequestStream
from tinyserve.logs import RateLimitedLog, fields

log = logging.getLogger(__name__)

HELLO_INTERVAL_S = 0.2
# PUSH holds this many messages for a connected engine before NOBLOCK sends fail; the engine's
# inbox drains every tick, so only a stalled engine gets near it.
SEND_HWM = 100_000
# Messages one wake-up of the listener takes before it lets the loop run (and comes back).
DRAIN_BATCH = 64


class EngineUnreachable(Exception):
    """The engine has no connected PULL socket right now (not started, died, restarting)."""


class EngineClient:
    """Sockets to the engine, the hello handshake, and the map of live request streams."""

    def __init__(self, config: Config, frontend_id: str | None = None) -> None:
        # Fixed-length hex: no frontend's topic is a prefix of another's.
        self.frontend_id = frontend_id or uuid.uuid4().hex
        self._ctx = zmq.Context()
        self._push = self._ctx.socket(zmq.PUSH)
        self._push.setsockopt(zmq.SNDHWM, SEND_HWM)
        self._push.setsockopt(zmq.LINGER, 0)
        self._push.setsockopt(zmq.IMMEDIATE, 1)
        self._push.connect(config.engine_in)
        self._sub = self._ctx.socket(zmq.SUB)
        self._sub.setsockopt(zmq.RCVHWM, 0)  # unlimited: nothing may be dropped on our side
        self._sub.setsockopt(zmq.LINGER, 0)
        self._sub.setsockopt(zmq.SUBSCRIBE, protocol.topic(self.frontend_id))
        self._sub.connect(config.engine_out)
        self._streams: dict[str, RequestStream] = {}
        self._ack_waiter: asyncio.Future[protocol.HelloAck] | None = None
        self.on_pending_change: Callable[[], None] | None = None
        self._queries: dict[int, asyncio.Future[dict[str, Any] | None]] = {}
        self._embeddings: dict[str, asyncio.Future[protocol.Embedded]] = {}
        # The event feed's receiver while this frontend has viewers (``watch_feed``).
        self.on_feed: Callable[[feed_protocol.FeedUpdate], None] | None = None
        self._next_query = 0
        self._dropped = RateLimitedLog(log)
        self._loop: asyncio.AbstractEventLoop | None = None  # while ``listen`` runs

    # -- sending ------------------------------------------------------------------------------

    def send(self, message: protocol.Message) -> None:
        """Send one message now or raise ``EngineUnreachable``."""
        try:
            self._push.send(protocol.encode(message), flags=zmq.NOBLOCK)
        except zmq.Again as exc:
            raise EngineUnreachable("engine is not connected") from exc

    def submit(self, submit: protocol.Submit) -> RequestStream:
        """Register the request's stream, then send it; its updates may arrive at once."""
        stream = RequestStream(submit.request_id)
        self._streams[submit.request_id] = stream
        try:
            self.send(submit)
        except EngineUnreachable:
            del self._streams[submit.request_id]
            raise
        return stream

    def cancel(self, request_id: str, reason: str = protocol.FINISH_CANCELLED) -> None:
        """Ask the engine to stop a request; best effort, never waits."""
        try:
            self.send(protocol.Cancel(request_id, self.frontend_id, reason))
        except EngineUnreachable:
            # The engine is gone or restarting: the request died with it.
            log.info("cancel not sent: engine unreachable", extra=fields(request_id=request_id))

    async def embed(self, embed: protocol.Embed) -> protocol.Embedded:
        """Send ``embed`` and wait for its one ``Embedded``: the engine's, or one with
        ``finish_reason`` ``ENGINE_LOST`` when the engine goes away first. Raises
        ``EngineUnreachable``; cancelled (the client left), it cancels the work in the engine."""
        answer: asyncio.Future[protocol.Embedded] = asyncio.get_running_loop().create_future()
        self._embeddings[embed.request_id] = answer
        try:
            self.send(embed)
            return await answer
        except asyncio.CancelledError:
            self.cancel(embed.request_id)
            raise
        finally:
            del self._embeddings[embed.request_id]

    async def timeline(self, request_id: str, timeout_s: float) -> dict[str, Any] | None:
        """Ask the engine for a request's timeline; None when it does not know the id.
        Raises ``EngineUnreachable``, or ``TimeoutError`` when no answer comes in time."""
        self._next_query += 1
        query_id = self._next_query
        answer = asyncio.get_running_loop().create_future()
        self._queries[query_id] = answer
        try:
            self.send(protocol.TimelineQuery(self.frontend_id, query_id, request_id))
            return await asyncio.wait_for(answer, timeout_s)
        finally:
            self._queries.pop(query_id, None)

    def watch_feed(self, on_feed: Callable[[feed_protocol.FeedUpdate], None] | None) -> None:
        """Receive the event feed's updates (``None``: stop). Unsubscribed, the SUB socket
        filters them out, so a frontend without viewers never decodes one."""
        if (on_feed is None) != (self.on_feed is None):
            option = zmq.SUBSCRIBE if on_feed is not None else zmq.UNSUBSCRIBE
            self._sub.setsockopt(option, feed_protocol.FEED_TOPIC)
            self._wake()  # an option call may take the descriptor's signal
        self.on_feed = on_feed

    def release(self, request_id: str) -> None:
        """Forget a request's stream once its handler is done with it."""
        self._streams.pop(request_id, None)

    # -- state ---------------------------------------------------------------------------------

    def pending(self) -> int:
        """Requests sent but not yet accepted or finished by the engine."""
        return sum(1 for s in self._streams.values() if s.pending)

    @property
    def in_flight(self) -> int:
        """Requests with a live stream (sent, handler not finished)."""
        return len(self._streams)

    def fail_all(self, detail: str) -> None:
        """End every live request with an error: the engine that held them is gone."""
        for stream in list(self._streams.values()):
            stream.fail(detail, lost=True)
        for request_id, answer in self._embeddings.items():
            if not answer.done():
                answer.set_result(
                    protocol.Embedded(self.frontend_id, request_id, ENGINE_LOST, detail=detail)
                )

    # -- handshake and listener ----------------------------------------------------------------

    async def handshake(self) -> protocol.HelloAck:
        """Say hello every ``HELLO_INTERVAL_S`` until the engine acknowledges this frontend.

        Repeated because a SUB socket that connected late misses what was published before its
        subscription reached the engine, the first ack included. Needs ``listen`` running.
        """
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[protocol.HelloAck] = loop.create_future()
        self._ack_waiter = waiter
        hello = protocol.Hello(self.frontend_id, os.getpid())
        try:
            while True:
                # Not connected yet: the next round tries again.
                with contextlib.suppress(EngineUnreachable):
                    self.send(hello)
                done, _ = await asyncio.wait({waiter}, timeout=HELLO_INTERVAL_S)
                if done:
                    return waiter.result()
        finally:
            self._ack_waiter = None
            waiter.cancel()

    async def listen(self) -> None:
        """Receive and dispatch engine messages until cancelled."""
        loop = self._loop = asyncio.get_running_loop()
        fd = self._sub.fileno()  # edge-triggered
        loop.add_reader(fd, self._drain)
        try:
            self._drain()  # what arrived before the reader was there
            await loop.create_future()  # never done: the reader does the work
        finally:
            loop.remove_reader(fd)
            self._loop = None

    def _wake(self) -> None:
        if self._loop is not None:
            self._loop.call_soon(self._drain)

    def _drain(self) -> None:
        """Take the messages waiting, ``DRAIN_BATCH`` at a time (then again on the loop's
        next turn, as the descriptor will not signal for them)."""
        if self._loop is None:  # a turn asked for just before ``listen`` ended
            return
        sub = self._sub
        for _ in range(DRAIN_BATCH):
            # Asked before each receive rather than learnt from zmq.Again: an exception for
            # every wake-up costs more than the question.
            if not cast(int, sub.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
                return
            frames = sub.recv_multipart(zmq.NOBLOCK)
            try:
                self._receive(frames)
            except Exception:
                # A bug of ours must not leave the rest waiting for a signal that came already.
                log.exception("engine message not handled")
        self._wake()

    def _receive(self, frames: list[bytes]) -> None:
        if len(frames) != 2:
            self._dropped.warning("dropping engine message", frames=len(frames))
            return
        try:
            message = protocol.decode(frames[1])
        except protocol.ProtocolError as exc:
            self._dropped.warning("dropping engine message", error=str(exc))
            return
        self._dispatch(message)

    def _dispatch(self, message: protocol.Message) -> None:
        if isinstance(message, protocol.TickOutput):
            settled = False
            for update in message.updates:
                stream = self._streams.get(update.request_id)
                if stream is not None:
                    was_pending = stream.pending
                    stream.deliver(update)
                    settled |= was_pending and not stream.pending
            if settled and self.on_pending_change is not None:
                # Our board slot must stop counting these at once, or every frontend's
                # admission would charge them twice (pending here, used at the engine).
                self.on_pending_change()
        elif isinstance(message, protocol.Embedded):
            embedded = self._embeddings.get(message.request_id)
            if embedded is not None and not embedded.done():
                embedded.set_result(message)
        elif isinstance(message, protocol.TimelineReply):
            answer = self._queries.get(message.query_id)
            if answer is not None and not answer.done():
                answer.set_result(message.timeline)
        elif isinstance(message, feed_protocol.FeedUpdate):
            if self.on_feed is not None:  # None: an update sent before we unsubscribed
                self.on_feed(message)
        elif isinstance(message, protocol.HelloAck):
            waiter = self._ack_waiter
            # Acks to our earlier, repeated hellos arrive after the first one: ignored.
            if message.frontend_id == self.frontend_id and waiter is not None and not waiter.done():
                waiter.set_result(message)
        else:
            log.warning("unexpected engine message", extra=fields(type=type(message).__name__))

    def close(self) -> None:
        """Close both sockets and the context without waiting for unsent messages."""
        self._push.close(linger=0)
        self._sub.close(linger=0)
        self._ctx.term()
