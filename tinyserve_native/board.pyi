"""The shared-memory board: the engine's stats and one slot per frontend, in one mmap'd file.

The engine ``create``s the board (mode 0600, in the server's 0700 runtime dir) and is the
only writer of the header: identity, heartbeat and the stats group. Each frontend
``attach``es, ``claim_slot``s one slot and is that slot's only writer. Everyone reads.

Consistency:

- The stats group (and the engine identity) is written under a seqlock; ``snapshot`` returns
  a copy no write overlapped. A seqlock left odd (the engine died mid-write) makes
  ``snapshot`` raise ``BoardError`` after about 100 ms instead of spinning forever.
- ``heartbeat_ns`` is one atomic field outside the seqlock (monotonic clock).
- A slot changes hands by compare-and-swap on its pid (0 free, > 0 owner); while a claim or
  release is in progress the pid reads -1 and readers skip the slot, so a slot in use always
  shows its owner's id and never the previous owner's count. Its other fields are each
  atomic but not a group: a reader may pair a new heartbeat with an old
  ``pending_requests``. Admission from the board is advisory; the engine is authoritative.
- A restarted engine replaces the file with a new one: a frontend still mapping the old
  file sees its heartbeat go stale and should ``close`` and ``attach`` again.

Layout (little-endian, offsets in bytes; bump ``LAYOUT_VERSION`` on any change):
header (``HEADER_SIZE`` = 128): magic u64 @0, version u32 @8, n_frontend_slots u32 @12,
engine_pid i64 @16, engine_started_ns u64 @24, heartbeat_ns u64 @32, seqlock u64 @40,
state, running, waiting, blocks_total, blocks_used, blocks_cached u32 @48..68, drain_rate
f64 @72, ticks u64 @80, embed_waiting u32 @88, reserved to 128; then ``n_frontend_slots``
slots (``SLOT_SIZE`` = 64): pid i64 @0, heartbeat_ns u64 @8, pending_requests u32 @16,
frontend_id char[32] (NUL-terminated UTF-8) @20, reserved to 64.
"""

from __future__ import annotations

from typing import Final, NamedTuple

MAGIC: Final[int]
"""``b"TSBOARD1"`` as a little-endian u64: the file's first 8 bytes."""
LAYOUT_VERSION: Final[int]
HEADER_SIZE: Final[int]
SLOT_SIZE: Final[int]
FRONTEND_ID_MAX: Final[int]
"""Longest frontend id, in bytes of UTF-8 (31)."""
MAX_FRONTEND_SLOTS: Final[int]

class BoardError(Exception):
    """The board is missing, malformed, closed, or has no room."""

class EngineSnapshot(NamedTuple):
    """One consistent reading of the engine's part of the board."""

    pid: int
    started_ns: int
    heartbeat_ns: int
    state: int  # tinyserve.protocol.STATE_*
    running: int
    waiting: int
    blocks_total: int
    blocks_used: int
    blocks_cached: int
    drain_rate: float  # requests finished per second, recent
    ticks: int
    embed_waiting: int  # embedding requests queued, not yet in a part

class FrontendSlot(NamedTuple):
    """A frontend slot in use."""

    # NOTE: shadows tuple.index on purpose (the name callers use); mypy objects to the override.
    index: int  # type: ignore[assignment]
    pid: int
    heartbeat_ns: int
    pending_requests: int  # sent to the engine, not yet accepted or finished
    frontend_id: str

class Board:
    """A mapped board file. Not constructible directly: use ``create`` or ``attach``.

    Methods raise ``BoardError`` once the board is closed. Each call runs entirely under the
    GIL, so a ``close`` from another thread (the engine's heartbeat thread) cannot unmap the
    file mid-call; that guarantee does not hold on a free-threaded build.
    """

    @classmethod
    def create(cls, path: str, frontend_slots: int = 64) -> Board:
        """Engine: write a new zeroed board (mode 0600) and atomically replace any file at
        ``path`` (temp file in the same directory, then rename); magic is written last.

        ``ValueError`` unless ``1 <= frontend_slots <= MAX_FRONTEND_SLOTS``.
        """
    @classmethod
    def attach(cls, path: str) -> Board:
        """Frontend: map the board at ``path``. ``BoardError`` if it is missing, too small,
        or has a bad magic, layout version or slot count.
        """
    @property
    def path(self) -> str:
        """Where the board file lives."""
    @property
    def n_frontend_slots(self) -> int:
        """Number of frontend slots."""
    def close(self) -> None:
        """Unmap; idempotent."""
    def unlink(self) -> None:
        """Remove the file (engine at exit) unless another board has replaced it since;
        idempotent, and allowed after ``close``.
        """
    def __enter__(self) -> Board: ...
    def __exit__(self, *exc_info: object) -> None:
        """``close``."""
    def set_identity(self, pid: int, started_ns: int) -> None:
        """Engine: record its pid and start time (seqlocked with the stats)."""
    def heartbeat(self, now_ns: int) -> None:
        """Engine: publish liveness, a ``time.monotonic_ns()`` timestamp."""
    def heartbeat_ns(self) -> int:
        """The engine's last heartbeat; 0 before the first."""
    def publish(
        self,
        *,
        state: int,
        running: int,
        waiting: int,
        blocks_total: int,
        blocks_used: int,
        blocks_cached: int,
        drain_rate: float,
        ticks: int,
        embed_waiting: int = 0,
    ) -> None:
        """Engine: replace the stats group in one seqlocked write. Counts are u32, ``ticks``
        u64 (``OverflowError`` outside); ``BoardError`` if another writer is mid-write.
        """
    def snapshot(self) -> EngineSnapshot:
        """A consistent copy of the identity and the stats group, plus the heartbeat."""
    def claim_slot(self, frontend_id: str, pid: int, now_ns: int) -> int:
        """Frontend: take the first free slot (pid 0 -> ``pid`` by compare-and-swap) with
        no requests in flight and heartbeat ``now_ns``; returns its index.

        ``BoardError`` when every slot is taken; ``ValueError`` if ``pid <= 0`` or the id is
        over ``FRONTEND_ID_MAX`` bytes.
        """
    def update_slot(self, index: int, heartbeat_ns: int, pending_requests: int) -> None:
        """Frontend: refresh its own slot. ``BoardError`` if the slot is not claimed,
        ``IndexError`` if ``index`` is out of range.
        """
    def release_slot(self, index: int, pid: int) -> bool:
        """Free the slot if ``pid`` owns it (compare-and-swap), zeroing it; returns whether it
        did. Used by a frontend at exit and by the engine to reclaim a dead frontend's slot.
        """
    def frontend_slots(self) -> list[FrontendSlot]:
        """The slots in use, by index."""
    def pending_requests(self) -> int:
        """Requests in flight at all frontends, summed over the slots in use."""
