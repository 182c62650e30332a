"""The frontend's read of the shared-memory board, as plain values.

Everything the frontend knows about ``tinyserve_native.board`` is in this module: opening the
file, and turning a snapshot into an ``EngineView`` (liveness) and a ``NodeLoad``; with the
engine's ``Limits`` (from its ``HelloAck``) that is what admission decides on.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from tinyserve import protocol
from tinyserve.procs import pid_alive
from tinyserve_native.board import FRONTEND_ID_MAX, Board, BoardError

HEARTBEAT_TIMEOUT_NS = 1_000_000_000


@dataclass(frozen=True)
class Limits:
    """Fixed facts of one engine incarnation, from its ``HelloAck``."""

    max_queue: int
    n_ctx: int  # one slot's cells: the most a request may fill
    slots: int = 0


@dataclass(frozen=True)
class NodeLoad:
    """The node's load right now: the engine's board figures plus every frontend's pending
    requests (sent to the engine, not yet accepted or finished)."""

    waiting: int
    running: int
    drain_rate: float  # requests leaving the engine per second of work (engine/scheduling/drain.py)
    pending_requests: int = 0
    draining: bool = False
    embed_waiting: int = 0  # embedding requests queued in the engine


# Stand-in when the board cannot be read: nothing known to be queued, no drain rate.
IDLE_LOAD = NodeLoad(waiting=0, running=0, drain_rate=0.0)


@dataclass(frozen=True)
class EngineView:
    """The engine's identity and liveness as one board snapshot shows them."""

    pid: int
    started_ns: int
    heartbeat_ns: int
    state: int

    def down_reason(self, now_ns: int) -> str | None:
        """Why this engine counts as down at ``now_ns`` (``time.monotonic_ns()``), or None.

        CLOCK_MONOTONIC is host-wide, so the engine's heartbeat and our clock compare directly.
        """
        if now_ns - self.heartbeat_ns > HEARTBEAT_TIMEOUT_NS:
            return f"engine heartbeat is {(now_ns - self.heartbeat_ns) / 1e9:.1f} s old"
        if not pid_alive(self.pid):
            return f"engine process {self.pid} is gone"
        return None


def open_board(path: str) -> tuple[Board, int]:
    """Attach the board at ``path``; returns it with the file's inode, which changes when the
    engine replaces the file (it recreates it by rename on every start)."""
    # stat before attach: if the file is replaced in between, the inode we keep is the old one
    # and the next liveness check sees a change (a spurious re-attach, never a missed one).
    inode = os.stat(path).st_ino
    return Board.attach(path), inode


def file_inode(path: str) -> int | None:
    """The inode ``path`` names now, None while there is no file."""
    try:
        return os.stat(path).st_ino
    except FileNotFoundError:
        return None


def engine_view(board: Board) -> EngineView:
    """Identity and liveness of the engine that owns ``board``."""
    snap = board.snapshot()
    return EngineView(snap.pid, snap.started_ns, snap.heartbeat_ns, snap.state)


def linked_frontends(board: Board) -> int:
    """Frontends of the node whose link to ``board``'s engine is up: a frontend claims its slot
    once the engine has acknowledged it and frees it when the link is lost; a frontend that
    died without freeing it (until the engine reaps the slot) is not counted."""
    return sum(1 for slot in board.frontend_slots() if pid_alive(slot.pid))


def load_of(board: Board) -> NodeLoad:
    """The node's load for admission: engine figures plus every frontend's pending requests."""
    snap = board.snapshot()
    return NodeLoad(
        waiting=snap.waiting,
        running=snap.running,
        drain_rate=snap.drain_rate,
        pending_requests=board.pending_requests(),
        draining=snap.state == protocol.STATE_DRAINING,
        embed_waiting=snap.embed_waiting,
    )


__all__ = [
    "FRONTEND_ID_MAX",
    "Board",
    "BoardError",
    "EngineView",
    "Limits",
    "NodeLoad",
    "engine_view",
    "linked_frontends",
    "load_of",
    "open_board",
]
