"""The engine process: ZeroMQ sockets, the board and signals around ``EngineCore``.

Loop: receive (block only when idle) -> housekeeping -> one core step -> its ``TickReport``
to the board, the wire, the metrics and the spans. The process's entry point is
``engine/main.py``.

An exception that escapes the loop is the second tier of failures (the core already ends a
failing request on its own): the engine logs it once, sends every request in flight its
error, and exits with status 1 for the launcher or systemd to restart it.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from types import FrameType
from typing import NoReturn

import zmq

from tinyserve import metrics
from tinyserve.config import Config, notify_socket, watchdog_interval_s
from tinyserve.engine.core import EngineCore
from tinyserve.engine.heartbeat import HeartbeatThread
from tinyserve.engine.kv.cache_store import KeptCache
from tinyserve.engine.output.events import EventFeed
from tinyserve.engine.output.meters import EngineMeter
from tinyserve.engine.output.report import TickReport
from tinyserve.engine.output.spans import SpanRecorder
from tinyserve.engine.runtime.runtime import LlamaRuntime, RuntimeSpec
from tinyserve.feed_protocol import FEED_TOPIC, FeedLease
from tinyserve.logs import RateLimitedLog, fields
from tinyserve.model import model_name
from tinyserve.procs import pid_alive
from tinyserve.protocol import (
    STATE_DRAINING,
    STATE_READY,
    Cancel,
    Embed,
    Hello,
    HelloAck,
    Message,
    ProtocolError,
    Submit,
    TickOutput,
    TimelineQuery,
    TimelineReply,
    decode,
    encode,
    submit_fault,
    topic,
)
from tinyserve.rundir import remove_quietly
from tinyserve.sdnotify import Notifier
from tinyserve.tracing import Tracing
from tinyserve.tracing import from_config as tracing_from_config
from tinyserve_native.board import Board

log = logging.getLogger(__name__)

IDLE_POLL_MS = 250
MAX_MESSAGES_PER_TICK = 1024
REAP_INTERVAL_NS = 1_000_000_000
PUB_HWM = 100_000  # one message per tick per frontend: hours of backlog before a drop
# A Submit of a whole context of token ids is tens of KB; a peer sending more is not ours.
MAX_INBOX_MESSAGE_BYTES = 16 * 1024 * 1024


class EngineProcess:
    """Owns the sockets, the board and the core; ``serve`` runs until stopped."""

    def __init__(self, config: Config, tracing: Tracing | None = None) -> None:
        self.config = config
        self.tracing = tracing or tracing_from_config(config, "engine")
        self.notifier = Notifier(notify_socket())
        self.started_ns = time.monotonic_ns()
        self.model_name = model_name(config.model, config.model_name)
        self.runtime = LlamaRuntime(RuntimeSpec.from_config(config))
        # OpenTelemetry spans of finished requests; None: tracing off
        self.spans = SpanRecorder(self.tracing) if self.tracing.tracer else None
        self.draft = (
            LlamaRuntime(RuntimeSpec.from_config(config, config.draft_model))
            if config.speculate == "draft"
            else None
        )
        self.core = EngineCore(config, self.runtime, draft=self.draft)
        self.kept = KeptCache.open(config, self.runtime, self.core.kv)  # --cache-dir
        if self.kept is not None:
            self.kept.load()
        process_metrics = metrics.setup(config.runtime_dir, metrics.ENGINE)
        self.meter = EngineMeter(
            process_metrics, config.policy, config.slots, config.tenant_weight_map
        )
        self.board = Board.create(config.board_path)
        self.board.set_identity(os.getpid(), self.started_ns)
        self.heartbeat = HeartbeatThread(self.board)
        self.zmq = zmq.Context()
        self.inbox = self.zmq.socket(zmq.PULL)
        self.outbox = self.zmq.socket(zmq.PUB)
        self.frontends: dict[str, int] = {}  # frontend id -> pid, from Hello
        self.feed = EventFeed(config.policy)  # the dashboard's: idle unless a frontend leases it
        self._stop_at_ns = 0
        self._next_reap_ns = 0
        self._next_watchdog_ns = 0
        # Read once: systemd sets it for the life of the process.
        self._watchdog_s = watchdog_interval_s() if self.notifier.enabled else None
        self._dropped = RateLimitedLog(log)

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        self.inbox.setsockopt(zmq.LINGER, 0)
        self.outbox.setsockopt(zmq.LINGER, 0)
        self.outbox.setsockopt(zmq.SNDHWM, PUB_HWM)
        self.inbox.setsockopt(zmq.MAXMSGSIZE, MAX_INBOX_MESSAGE_BYTES)
        self.inbox.bind(self.config.engine_in)
        self.outbox.bind(self.config.engine_out)
        self.heartbeat.start()
        self._publish_board(self.core.report())
        self.notifier.ready(f"serving {self.model_name}")
        log.info(
            "engine ready",
            extra=fields(
                model=self.model_name,
                runtime_dir=self.config.runtime_dir,
                kv=str(self.runtime.kv),
                slots=self.config.slots,
            ),
        )

    def request_stop(self, signum: int, _frame: FrameType | None) -> None:
        """First signal: drain (finish running work, refuse new). The loop ends when done."""
        if not self.core.draining:
            log.info("draining", extra=fields(signal=signal.Signals(signum).name))
            self.core.drain()
            self._stop_at_ns = time.monotonic_ns() + int(self.config.drain_timeout * 1e9)
            self.notifier.stopping()
        else:
            self._stop_at_ns = time.monotonic_ns()

    def close(self) -> None:
        self.heartbeat.stop()
        self.inbox.close()
        self.outbox.close()
        self.zmq.term()
        for endpoint in (self.config.engine_in, self.config.engine_out):
            remove_quietly(endpoint.removeprefix("ipc://"))
        self.board.close()
        self.board.unlink()
        self.core.embeddings.close()  # before the weights it may share
        self.runtime.close()
        if self.draft is not None:
            self.draft.close()
        self.tracing.shutdown()

    # -- the loop ----------------------------------------------------------------------------

    def serve(self) -> None:
        """Serve until a drain ends. ``SystemExit(1)`` if the engine failed (see ``_fail``)."""
        try:
            while not self._finished():
                self._pass()
            self.core.end_all("the engine stopped (drain timeout)")
            self._report(self.core.report())
            if self.kept is not None:
                self.kept.save()
        except Exception as exc:
            self._fail(exc)

    def _pass(self) -> None:
        self._receive(block=not self.core.has_work())
        self._housekeeping()
        core = self.core
        self._report(core.step() if core.has_work() or core.pending() else core.report())
        self.heartbeat.progress_ns = time.monotonic_ns()

    def _report(self, report: TickReport) -> None:
        """Everything follows from the tick's report. Board first: a frontend that sees a
        request's output also sees the capacity and counts of the tick that produced it."""
        self._publish_board(report)
        self._publish(report)
        self.meter.after_pass(report)  # gauges too, when idle
        if self.spans is not None:
            for timeline in report.ended():
                self.spans.record(timeline)
        if self.feed.until_ns:  # 0 while no frontend has viewers: the feed costs this
            self._feed(report)

    def _feed(self, report: TickReport) -> None:
        """Fold the report into the event feed; publish an update when one is due."""
        feed, now = self.feed, time.monotonic_ns()
        if now >= feed.until_ns and not feed.expire(now):
            return
        feed.observe(report, now)
        if feed.due(now):
            core = self.core
            update = feed.take(
                now, core.slots(), core.queued(), report.load, core.queued_embeddings()
            )
            self.outbox.send_multipart([FEED_TOPIC, encode(update)])

    def _fail(self, exc: Exception) -> NoReturn:
        """The engine itself is broken (the model or context, or an invariant of its state):
        say so once, end every request in flight with an error, exit non-zero. ``run`` still
        closes the sockets and the board on the way out."""
        log.critical(
            "engine failed, exiting with status 1: %s: %s", type(exc).__name__, exc, exc_info=exc
        )
        try:
            self._publish(self.core.abandon(f"engine failed ({type(exc).__name__})"))
        except Exception as again:  # the sockets themselves may be what failed
            log.error("could not send in-flight requests their error: %r", again)
        raise SystemExit(1) from None

    def _finished(self) -> bool:
        if not self.core.draining:
            return False
        return not self.core.has_work() or time.monotonic_ns() >= self._stop_at_ns

    def _receive(self, block: bool) -> None:
        if block and not self.inbox.poll(IDLE_POLL_MS):
            return
        for _ in range(MAX_MESSAGES_PER_TICK):
            try:
                frames = self.inbox.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if len(frames) != 1:
                self._dropped.warning("dropped message", error=f"{len(frames)} frames, not 1")
                continue
            try:
                self._handle(decode(frames[0]))
            except ProtocolError as exc:
                self._dropped.warning("dropped message", error=str(exc))

    def _handle(self, message: Message) -> None:
        if isinstance(message, Submit):
            fault = submit_fault(message, self.runtime.n_vocab)
            if fault:
                self._dropped.warning("refused malformed submit", error=fault)
                self.core.refuse(message, fault)
            else:
                self.core.submit(message)
        elif isinstance(message, Embed):
            self.core.embed(message)
        elif isinstance(message, Cancel):
            self.core.cancel(message.request_id, message.reason)
        elif isinstance(message, Hello):
            self._greet(message)
        elif isinstance(message, TimelineQuery):
            self._answer_timeline_query(message)
        elif isinstance(message, FeedLease):
            self.feed.lease(message.frontend_id, message.seconds, time.monotonic_ns())
        else:
            self._dropped.warning("dropped unexpected message", type=type(message).__name__)

    def _answer_timeline_query(self, query: TimelineQuery) -> None:
        fid = query.frontend_id  # decode checked its type and that it is a topic
        reply = TimelineReply(fid, query.query_id, self.core.timeline_of(query.request_id))
        self.outbox.send_multipart([topic(fid), encode(reply)])

    def _greet(self, hello: Hello) -> None:
        if hello.frontend_id not in self.frontends:
            log.info("frontend joined", extra=fields(frontend=hello.frontend_id, pid=hello.pid))
        self.frontends[hello.frontend_id] = hello.pid
        ack = HelloAck(
            hello.frontend_id,
            os.getpid(),
            self.started_ns,
            self.model_name,
            self.core.n_ctx,
            self.runtime.n_vocab,
            self.config.slots,
            self.config.block_size,
            self.core.load().blocks_total,
            self.config.max_queue,
            self.config.gpu_layers,
            self.core.embeddings.size,
        )
        self.outbox.send_multipart([topic(hello.frontend_id), encode(ack)])

    def _publish(self, report: TickReport) -> None:
        """One ``TickOutput`` per frontend with updates this tick; each ended embedding."""
        for frontend_id, of_frontend in report.updates.items():
            out = TickOutput(frontend_id, of_frontend)
            self.outbox.send_multipart([topic(frontend_id), encode(out)])
        for embedded in report.embedded:
            self.outbox.send_multipart([topic(embedded.frontend_id), encode(embedded)])

    # -- housekeeping ------------------------------------------------------------------------

    def _housekeeping(self) -> None:
        now = time.monotonic_ns()
        if self._watchdog_s and now >= self._next_watchdog_ns:
            self.notifier.watchdog()
            self._next_watchdog_ns = now + int(self._watchdog_s * 1e9)
        if now >= self._next_reap_ns:
            self._next_reap_ns = now + REAP_INTERVAL_NS
            self._reap_frontends()

    def _reap_frontends(self) -> None:
        """Cancel the work of frontends whose process is gone, free their board slots, and
        drop the live gauges of every dead process of the node."""
        for slot in self.board.frontend_slots():
            if not pid_alive(slot.pid):
                self.board.release_slot(slot.index, slot.pid)
        # by the metrics files, not only the frontends we know: one that died before
        # greeting this engine (killed while it restarted) has gauges but no Hello here.
        metrics.forget_dead(self.meter.metrics.directory)
        for frontend_id, pid in list(self.frontends.items()):
            if not pid_alive(pid):
                del self.frontends[frontend_id]
                cancelled = self.core.cancel_frontend(frontend_id)
                log.warning(
                    "frontend gone", extra=fields(frontend=frontend_id, cancelled=cancelled)
                )

    def _publish_board(self, report: TickReport) -> None:
        load = report.load
        self.board.publish(
            state=STATE_DRAINING if self.core.draining else STATE_READY,
            running=load.running,
            waiting=load.waiting,
            blocks_total=load.blocks_total,
            blocks_used=load.blocks_used,
            blocks_cached=load.blocks_cached,
            drain_rate=load.drain_rate,
            ticks=load.tick,
            embed_waiting=load.embed_waiting,
        )
