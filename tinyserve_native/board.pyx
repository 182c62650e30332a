"""The shared-memory board: engine stats and frontend slots in one mmap'd file.

Single writers only: the engine writes the header, each frontend writes the slot it claimed.
The engine's stats group sits under a seqlock so readers get consistent snapshots; slots
change hands by compare-and-swap on their pid.
"""

import mmap
import os
import tempfile
from typing import NamedTuple

from cpython.buffer cimport PyBUF_WRITABLE, PyBuffer_Release, PyObject_GetBuffer
from libc.stdint cimport int64_t, uint32_t, uint64_t
from libc.string cimport memcpy, memset
from posix.time cimport CLOCK_MONOTONIC, clock_gettime, timespec

cdef extern from "<sched.h>" nogil:
    int sched_yield()

MAGIC = 0x314452414F425354  # b"TSBOARD1" read as a little-endian u64
LAYOUT_VERSION = 3
HEADER_SIZE = sizeof(board_header)
SLOT_SIZE = sizeof(board_slot)
FRONTEND_ID_MAX = FRONTEND_ID_BYTES - 1
MAX_FRONTEND_SLOTS = 4096

# A slot's pid while its owner initialises or tears it down; readers skip it.
cdef int64_t SLOT_BUSY = -1
# A reader gives up on a seqlock held odd this long: the engine died mid-write.
cdef long long SNAPSHOT_TIMEOUT_NS = 100_000_000
cdef int SPINS_BEFORE_YIELD = 64


class BoardError(Exception):
    """The board is missing, malformed, closed, or has no room."""


EngineSnapshot = NamedTuple("EngineSnapshot", [
    ("pid", int), ("started_ns", int), ("heartbeat_ns", int), ("state", int),
    ("running", int), ("waiting", int), ("blocks_total", int), ("blocks_used", int),
    ("blocks_cached", int), ("drain_rate", float), ("ticks", int), ("embed_waiting", int),
])
EngineSnapshot.__doc__ = "One consistent reading of the engine's part of the board."
# NOTE: the functional form guesses the module from the caller's frame, which a compiled
# module lacks; without this the tuples would not pickle (multiprocessing, logging).
EngineSnapshot.__module__ = __name__

FrontendSlot = NamedTuple("FrontendSlot", [
    ("index", int), ("pid", int), ("heartbeat_ns", int), ("pending_requests", int),
    ("frontend_id", str),
])
FrontendSlot.__doc__ = "A frontend slot in use, as read (each field atomically, not as a group)."
FrontendSlot.__module__ = __name__


cdef long long _monotonic_ns() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return <long long>ts.tv_sec * 1_000_000_000 + ts.tv_nsec


def _layout_size(uint32_t n_slots) -> int:
    return sizeof(board_header) + <size_t>n_slots * sizeof(board_slot)


def _file_id(st: os.stat_result) -> tuple:
    return (st.st_dev, st.st_ino)


cdef class Board:
    """A mapped board file; see board.pyi for the protocol."""

    def __init__(self) -> None:
        raise TypeError("use Board.create (engine) or Board.attach (frontend)")

    @classmethod
    def create(cls, path: str, frontend_slots: int = 64) -> Board:
        """Engine: write a fresh board and atomically replace any old file at ``path``."""
        if not 1 <= frontend_slots <= MAX_FRONTEND_SLOTS:
            raise ValueError(f"frontend_slots must be in 1..{MAX_FRONTEND_SLOTS}")
        size = _layout_size(frontend_slots)
        path = os.fspath(path)
        directory = os.path.dirname(os.path.abspath(path))
        # mkstemp creates the file 0600; a frontend that opens `path` meets either the old
        # board or the complete new one, never a half-written file.
        fd, tmp = tempfile.mkstemp(prefix=".board-", dir=directory)
        board = None
        try:
            os.ftruncate(fd, size)  # zero-filled
            board = <Board>cls.__new__(cls)
            board._map(path, mmap.mmap(fd, size), _file_id(os.fstat(fd)))
            board._init_header(frontend_slots)
            os.replace(tmp, path)
        except BaseException:
            if board is not None:
                board.close()
            os.unlink(tmp)
            raise
        finally:
            os.close(fd)
        return board

    @classmethod
    def attach(cls, path: str) -> Board:
        """Frontend: map an existing board; ``BoardError`` unless it is complete and current."""
        path = os.fspath(path)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            raise BoardError(f"no board at {path} (is the engine running?)") from None
        except OSError as exc:
            raise BoardError(f"cannot open board {path}: {exc}") from exc
        try:
            st = os.fstat(fd)
            if st.st_size < HEADER_SIZE:
                raise BoardError(f"board {path} is too small ({st.st_size} bytes)")
            board = <Board>cls.__new__(cls)
            board._map(path, mmap.mmap(fd, st.st_size), _file_id(st))
        finally:
            os.close(fd)
        try:
            board._check_header(st.st_size)
        except BaseException:
            board.close()
            raise
        return board

    cdef int _init_header(self, uint32_t n_slots) except -1:
        cdef board_header *h = self._header()
        h.version = LAYOUT_VERSION
        h.n_frontend_slots = n_slots
        self._n_slots = n_slots
        tsb_store_u64_release(&h.magic, MAGIC)
        return 0

    cdef int _check_header(self, Py_ssize_t size) except -1:
        cdef board_header *h = self._header()
        cdef uint64_t magic = tsb_load_u64_acquire(&h.magic)
        if magic != MAGIC:
            raise BoardError(f"{self._path} is not a board (magic {magic:#018x})")
        if h.version != LAYOUT_VERSION:
            raise BoardError(
                f"board {self._path} has layout version {h.version}, expected {LAYOUT_VERSION}"
            )
        n = h.n_frontend_slots
        if not 1 <= n <= MAX_FRONTEND_SLOTS or size < _layout_size(n):
            raise BoardError(f"board {self._path} is truncated or has a bad slot count ({n})")
        self._n_slots = n
        return 0

    cdef int _map(self, object path, object mm, tuple file_id) except -1:
        PyObject_GetBuffer(mm, &self._buf, PyBUF_WRITABLE)
        self._mm = mm
        self._path = path
        self._file_id = file_id
        self._h = <board_header *>self._buf.buf
        self._slots = <board_slot *>(<char *>self._buf.buf + sizeof(board_header))
        return 0

    def __dealloc__(self):
        if self._h != NULL:
            PyBuffer_Release(&self._buf)

    @property
    def path(self) -> str:
        return self._path

    @property
    def n_frontend_slots(self) -> int:
        return self._n_slots

    def close(self) -> None:
        """Unmap the board; idempotent. Other methods raise ``BoardError`` afterwards."""
        if self._h == NULL:
            return
        self._h = NULL
        self._slots = NULL
        PyBuffer_Release(&self._buf)
        self._mm.close()
        self._mm = None

    def unlink(self) -> None:
        """Remove the file if it is still this board's; idempotent."""
        try:
            if _file_id(os.stat(self._path)) == self._file_id:
                os.unlink(self._path)
        except FileNotFoundError:
            pass

    def __enter__(self) -> Board:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def set_identity(self, int64_t pid, uint64_t started_ns) -> None:
        """Engine: record its pid and start time (under the seqlock, like the stats)."""
        cdef board_header *h = self._header()
        self._write_begin()
        tsb_store_i64(&h.engine_pid, pid)
        tsb_store_u64(&h.engine_started_ns, started_ns)
        self._write_end()

    def heartbeat(self, uint64_t now_ns) -> None:
        """Engine: publish liveness (a monotonic-clock timestamp)."""
        tsb_store_u64_release(&self._header().heartbeat_ns, now_ns)

    def heartbeat_ns(self) -> int:
        """The engine's last heartbeat (0 before the first)."""
        return tsb_load_u64_acquire(&self._header().heartbeat_ns)

    def publish(
        self,
        *,
        uint32_t state,
        uint32_t running,
        uint32_t waiting,
        uint32_t blocks_total,
        uint32_t blocks_used,
        uint32_t blocks_cached,
        double drain_rate,
        uint64_t ticks,
        uint32_t embed_waiting=0,
    ) -> None:
        """Engine: replace the stats group in one seqlock write."""
        cdef engine_stats *s = &self._header().stats
        self._write_begin()
        tsb_store_u32(&s.state, state)
        tsb_store_u32(&s.running, running)
        tsb_store_u32(&s.waiting, waiting)
        tsb_store_u32(&s.blocks_total, blocks_total)
        tsb_store_u32(&s.blocks_used, blocks_used)
        tsb_store_u32(&s.blocks_cached, blocks_cached)
        tsb_store_f64(&s.drain_rate, drain_rate)
        tsb_store_u64(&s.ticks, ticks)
        tsb_store_u32(&s.embed_waiting, embed_waiting)
        self._write_end()

    def snapshot(self):
        """A consistent copy of the engine's identity, heartbeat and stats."""
        cdef engine_stats s
        cdef int64_t pid
        cdef uint64_t started
        self._read_stats(&s, &pid, &started)
        return EngineSnapshot(
            pid, started, tsb_load_u64_acquire(&self._h.heartbeat_ns), s.state,
            s.running, s.waiting, s.blocks_total, s.blocks_used, s.blocks_cached,
            s.drain_rate, s.ticks, s.embed_waiting,
        )

    def claim_slot(self, str frontend_id not None, int64_t pid, uint64_t now_ns) -> int:
        """Frontend: take the first free slot; returns its index."""
        if pid <= 0:
            raise ValueError(f"pid must be > 0, got {pid}")
        cdef bytes raw = frontend_id.encode()
        if len(raw) > FRONTEND_ID_MAX:
            raise ValueError(f"frontend_id is over {FRONTEND_ID_MAX} bytes of UTF-8")
        cdef char name[FRONTEND_ID_BYTES]
        memset(name, 0, FRONTEND_ID_BYTES)
        memcpy(name, <const char *>raw, len(raw))
        cdef uint32_t i
        cdef board_slot *slot
        self._header()
        for i in range(self._n_slots):
            slot = &self._slots[i]
            if tsb_load_i64(&slot.pid) != 0 or not tsb_cas_i64(&slot.pid, 0, SLOT_BUSY):
                continue
            tsb_store_bytes(slot.frontend_id, name, FRONTEND_ID_BYTES)
            tsb_store_u64(&slot.heartbeat_ns, now_ns)
            tsb_store_u32(&slot.pending_requests, 0)
            # NOTE: the release store publishes the fields above with the pid: a reader that
            # sees pid > 0 (acquire) sees this owner's id and a zero count of requests.
            tsb_store_i64_release(&slot.pid, pid)
            return i
        raise BoardError(f"all {self._n_slots} frontend slots are taken")

    def update_slot(
        self,
        Py_ssize_t index,
        uint64_t heartbeat_ns,
        uint32_t pending_requests,
    ) -> None:
        """Frontend: refresh its slot's heartbeat and its requests in flight."""
        cdef board_slot *slot = self._slot(index)
        if tsb_load_i64(&slot.pid) <= 0:
            raise BoardError(f"frontend slot {index} is not claimed")
        tsb_store_u32(&slot.pending_requests, pending_requests)
        tsb_store_u64(&slot.heartbeat_ns, heartbeat_ns)

    def release_slot(self, Py_ssize_t index, int64_t pid) -> bool:
        """Free slot ``index`` if ``pid`` still owns it; False if it does not."""
        cdef board_slot *slot = self._slot(index)
        if pid <= 0 or not tsb_cas_i64(&slot.pid, pid, SLOT_BUSY):
            return False
        cdef char zeros[FRONTEND_ID_BYTES]
        memset(zeros, 0, FRONTEND_ID_BYTES)
        tsb_store_bytes(slot.frontend_id, zeros, FRONTEND_ID_BYTES)
        tsb_store_u64(&slot.heartbeat_ns, 0)
        tsb_store_u32(&slot.pending_requests, 0)
        tsb_store_i64_release(&slot.pid, 0)
        return True

    def frontend_slots(self) -> list:
        """The slots in use, in index order."""
        self._header()
        cdef list slots = []
        cdef uint32_t i
        for i in range(self._n_slots):
            slot = self._read_slot(i)
            if slot is not None:
                slots.append(slot)
        return slots

    def pending_requests(self) -> int:
        """Requests in flight at all frontends, summed over the slots in use."""
        cdef uint64_t requests = 0
        cdef board_slot *slot
        cdef uint32_t i
        self._header()
        for i in range(self._n_slots):
            slot = &self._slots[i]
            if tsb_load_i64_acquire(&slot.pid) > 0:
                requests += tsb_load_u32(&slot.pending_requests)
        return requests

    def __repr__(self) -> str:
        state = "closed" if self._h == NULL else f"{self._n_slots} frontend slots"
        return f"<Board {self._path!r}, {state}>"

    cdef board_header *_header(self) except NULL:
        if self._h == NULL:
            raise BoardError("board is closed")
        return self._h

    cdef board_slot *_slot(self, Py_ssize_t index) except NULL:
        self._header()
        if index < 0 or index >= self._n_slots:
            raise IndexError(f"frontend slot {index} out of range 0..{self._n_slots - 1}")
        return &self._slots[index]

    cdef int _write_begin(self) except -1:
        cdef uint64_t seq = tsb_load_u64(&self._h.seq)
        # NOTE: the exchange also catches a second writer: the engine is the only one, and
        # two would interleave their fields under one even count.
        if seq & 1 or not tsb_cas_u64(&self._h.seq, seq, seq + 1):
            raise BoardError("engine stats are being written by someone else")
        return 0

    cdef void _write_end(self) noexcept:
        tsb_store_u64_release(&self._h.seq, tsb_load_u64(&self._h.seq) + 1)

    cdef int _read_stats(self, engine_stats *out, int64_t *pid, uint64_t *started) except -1:
        cdef board_header *h = self._header()
        cdef uint64_t before
        cdef long long deadline = _monotonic_ns() + SNAPSHOT_TIMEOUT_NS
        cdef int attempt = 0
        while True:
            before = tsb_load_u64_acquire(&h.seq)
            if (before & 1) == 0:
                pid[0] = tsb_load_i64(&h.engine_pid)
                started[0] = tsb_load_u64(&h.engine_started_ns)
                out.state = tsb_load_u32(&h.stats.state)
                out.running = tsb_load_u32(&h.stats.running)
                out.waiting = tsb_load_u32(&h.stats.waiting)
                out.blocks_total = tsb_load_u32(&h.stats.blocks_total)
                out.blocks_used = tsb_load_u32(&h.stats.blocks_used)
                out.blocks_cached = tsb_load_u32(&h.stats.blocks_cached)
                out.drain_rate = tsb_load_f64(&h.stats.drain_rate)
                out.ticks = tsb_load_u64(&h.stats.ticks)
                out.embed_waiting = tsb_load_u32(&h.stats.embed_waiting)
                # NOTE: the fence keeps the loads above from sinking below the re-read of
                # seq; with it, an unchanged even seq proves no write overlapped them.
                tsb_fence_acquire()
                if tsb_load_u64(&h.seq) == before:
                    return 0
            attempt += 1
            if attempt >= SPINS_BEFORE_YIELD:
                if _monotonic_ns() > deadline:
                    raise BoardError("engine stats stayed mid-write; did the engine die?")
                sched_yield()

    cdef object _read_slot(self, Py_ssize_t index):
        cdef board_slot *slot = &self._slots[index]
        cdef char name[FRONTEND_ID_BYTES]
        cdef int64_t pid = tsb_load_i64_acquire(&slot.pid)
        if pid <= 0:
            return None
        cdef uint64_t heartbeat = tsb_load_u64(&slot.heartbeat_ns)
        cdef uint32_t requests = tsb_load_u32(&slot.pending_requests)
        tsb_load_bytes(name, slot.frontend_id, FRONTEND_ID_BYTES)
        tsb_fence_acquire()
        if tsb_load_i64(&slot.pid) != pid:
            return None  # released (or re-claimed) while we read: not a record to trust
        name[FRONTEND_ID_BYTES - 1] = 0
        return FrontendSlot(
            index, pid, heartbeat, requests, name.decode(errors="replace")
        )
