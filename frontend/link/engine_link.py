"""The frontend's connection to one engine incarnation: board, slot, handshake, liveness.

``EngineLink.run`` (a task owned by the app's ``cleanup_ctx``) loops forever through:

1. attach the board file (retrying until the engine has created it) and wait for a live engine;
2. hello/ack handshake on the engine sockets, then claim this frontend's board slot;
3. serve: every ``TICK_S`` publish our slot (heartbeat, pending) and check the engine; stop
   when its heartbeat is over a second old, its pid is gone, or the board file was replaced;
4. on loss, end every in-flight request with an error, free the slot and go back to 1.

So an engine restart is followed without restarting the frontend. A slot is held exactly
while a link is up, which is how one frontend counts the others linked to the engine
(``unready_reason``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable

from tinyserve import protocol
from tinyserve.config import Config
from tinyserve.frontend.link import board_view
from tinyserve.frontend.link.board_view import Board, BoardError, EngineView, Limits, NodeLoad
from tinyserve.frontend.link.engine_client import EngineClient
from tinyserve.logs import fields
from tinyserve.metrics import FrontendMetrics
from tinyserve.procs import pid_alive

log = logging.getLogger(__name__)

TICK_S = 0.25
ENGINE_UNAVAILABLE = "engine unavailable"


class EngineLink:
    """Tracks whether an engine is serving this frontend, and which one."""

    def __init__(
        self, config: Config, client: EngineClient, metrics: FrontendMetrics | None = None
    ) -> None:
        self._config = config
        self._metrics = metrics
        if metrics is not None:
            metrics.engine_up.set(0)
            metrics.frontend_requests_in_flight.set(0)
        self._client = client
        client.on_pending_change = self.publish
        self._board: Board | None = None
        self._inode: int | None = None
        self._slot: int | None = None
        self.ack: protocol.HelloAck | None = None  # set while serving, None otherwise
        self._limits: Limits | None = None  # the ack's, made once per handshake
        self.serving = asyncio.Event()
        self.on_serving: Callable[[], None] | None = None  # called each time a link is up

    # -- what handlers ask ---------------------------------------------------------------------

    @property
    def limits(self) -> Limits | None:
        """Admission limits of the engine being served, None while not serving."""
        return self._limits if self.serving.is_set() else None

    def unready_reason(self) -> str | None:
        """Why ``/ready`` must not say 200 now, or None.

        Ready means that a request reaching our port now is served: our link is up, its
        engine is alive at this moment (not only at our last tick), and at least
        ``--ready-frontends`` frontends of the node are linked to it, since every frontend
        sharing our port (SO_REUSEPORT) takes requests too.
        """
        ack, board = self.ack, self._board
        if ack is None or board is None:
            return "engine handshake not done or engine down"
        down = self._down_reason(ack.engine_started_ns)
        if down is not None:
            return down
        try:
            linked = board_view.linked_frontends(board)
        except BoardError as exc:
            return f"engine board unreadable: {exc}"
        wanted = self._config.ready_frontends
        if linked < wanted:
            return f"{linked} of {wanted} frontends linked to the engine"
        return None

    def load(self) -> NodeLoad | None:
        """The node's current load from the board, None while not serving or unreadable."""
        if self._board is None or not self.serving.is_set():
            return None
        try:
            return board_view.load_of(self._board)
        except BoardError as exc:
            # A seqlock left odd by an engine that died mid-write: the watch loop will notice.
            log.warning("board unreadable", extra=fields(error=str(exc)))
            return None

    def publish(self) -> None:
        """Write our heartbeat and pending figures to our board slot now (cheap: shared memory),
        so other frontends' admission sees a request we just sent without waiting a tick."""
        if self._board is None or self._slot is None:
            return
        requests = self._client.pending()
        try:
            self._board.update_slot(self._slot, time.monotonic_ns(), requests)
        except BoardError as exc:
            log.warning("board slot not writable", extra=fields(error=str(exc), slot=self._slot))

    # -- the loop ------------------------------------------------------------------------------

    async def run(self) -> None:
        """Connect, serve, and reconnect after every engine loss, until cancelled."""
        try:
            while True:
                try:
                    reason = await self._serve_one_engine()
                except BoardError as exc:
                    # No free slot, or a board that went bad under us: retry, never give up,
                    # or this frontend would answer 503 for the rest of its life.
                    log.error("board error", extra=fields(error=str(exc)))
                    reason = f"board error: {exc}"
                self._lose(reason)
                self._detach()
                await asyncio.sleep(TICK_S)
        finally:
            self._lose("frontend stopping", expected=True)
            self._detach()

    async def _serve_one_engine(self) -> str:
        """Attach, handshake and watch one engine incarnation; returns why it ended."""
        view = await self._attach_live_engine()
        if not await self._handshake(view):
            return "handshake abandoned"
        return await self._watch()

    async def _attach_live_engine(self) -> EngineView:
        """Attach the current board file and wait until its engine is alive."""
        while True:
            view = self._attach_once()
            if view is not None and view.down_reason(time.monotonic_ns()) is None:
                return view
            await asyncio.sleep(TICK_S)

    def _attach_once(self) -> EngineView | None:
        inode = board_view.file_inode(self._config.board_path)
        if inode is None:
            self._detach()
            return None
        if inode != self._inode or self._board is None:
            self._detach()
            try:
                self._board, self._inode = board_view.open_board(self._config.board_path)
            except (FileNotFoundError, BoardError) as exc:
                # Replaced or half-written while we opened it: try again next tick.
                log.debug("board not attachable yet", extra=fields(error=str(exc)))
                return None
        try:
            return board_view.engine_view(self._board)
        except BoardError as exc:
            log.debug("board not readable yet", extra=fields(error=str(exc)))
            return None

    async def _handshake(self, view: EngineView) -> bool:
        """Exchange hello/ack, then claim a slot; False when the engine went down meanwhile."""
        assert self._board is not None
        handshake = asyncio.ensure_future(self._client.handshake())
        try:
            while not handshake.done():
                if self._down_reason(view.started_ns) is not None:
                    return False
                await asyncio.wait({handshake}, timeout=TICK_S)
            ack = handshake.result()
        finally:
            handshake.cancel()
        if ack.engine_started_ns != view.started_ns:
            log.warning("ack from another engine incarnation than the board's; retrying")
            return False
        # Only now, with the ack in hand: another frontend that sees our slot counts us as
        # serving. The board's id field is one byte short of a uuid4 hex; the slot's id is
        # only a label (slots are owned and reaped by pid), so a prefix is enough.
        label = self._client.frontend_id[: board_view.FRONTEND_ID_MAX]
        self._slot = self._board.claim_slot(label, os.getpid(), time.monotonic_ns())
        self.ack, self._limits = ack, Limits(ack.max_queue, ack.n_ctx, ack.slots)
        self.serving.set()
        log.info(
            "engine handshake done",
            extra=fields(
                frontend_id=self._client.frontend_id,
                engine_pid=ack.engine_pid,
                model=ack.model_name,
                n_ctx=ack.n_ctx,
                blocks_total=ack.blocks_total,
                slot=self._slot,
            ),
        )
        if self.on_serving is not None:
            self.on_serving()
        return True

    async def _watch(self) -> str:
        """Publish our slot every tick until the engine is down; returns why."""
        assert self.ack is not None
        while True:
            self.publish()
            reason = self._down_reason(self.ack.engine_started_ns)
            if reason is not None:
                return reason
            if self._metrics is not None:
                self._metrics.engine_up.set(1)
                self._metrics.frontend_requests_in_flight.set(self._client.in_flight)
            await asyncio.sleep(TICK_S)

    def _down_reason(self, started_ns: int) -> str | None:
        if board_view.file_inode(self._config.board_path) != self._inode or self._board is None:
            return "engine board was replaced (engine restarted)"
        try:
            view = board_view.engine_view(self._board)
        except BoardError as exc:
            return f"engine board unreadable: {exc}"
        if view.started_ns != started_ns:
            return "engine restarted"
        return view.down_reason(time.monotonic_ns())

    def _lose(self, reason: str, *, expected: bool = False) -> None:
        """Stop serving: every request in flight on the lost engine ends now."""
        was_serving = self.serving.is_set()
        self.serving.clear()
        if self._metrics is not None:
            self._metrics.engine_up.set(0)
            self._metrics.frontend_requests_in_flight.set(0)
            engine_pid = self.ack.engine_pid if self.ack else None
            if engine_pid and not pid_alive(engine_pid):  # its live gauges go, counters stay
                self._metrics.process.forget_process(engine_pid)
        self.ack = self._limits = None
        if was_serving:
            level = logging.INFO if expected else logging.ERROR
            log.log(
                level,
                "engine link closed",
                extra=fields(reason=reason, in_flight=self._client.in_flight),
            )
        self._client.fail_all(f"{ENGINE_UNAVAILABLE}: {reason}")

    def _detach(self) -> None:
        if self._board is not None:
            if self._slot is not None:
                self._board.release_slot(self._slot, os.getpid())
            self._board.close()
        self._board, self._inode, self._slot = None, None, None
