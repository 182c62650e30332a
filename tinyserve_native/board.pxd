# Layout of the shared-memory board and the cdef surface of Board; see board.pyi.
#
# The file is a board_header followed by n_frontend_slots board_slot records. Offsets are
# part of the cross-process contract: change the layout only together with LAYOUT_VERSION.

from cpython.buffer cimport Py_buffer
from libc.stdint cimport int64_t, uint8_t, uint32_t, uint64_t

cdef extern from "board_atomic.h" nogil:
    uint64_t tsb_load_u64_acquire(const uint64_t *p)
    uint64_t tsb_load_u64(const uint64_t *p)
    void tsb_store_u64_release(uint64_t *p, uint64_t v)
    void tsb_store_u64(uint64_t *p, uint64_t v)
    bint tsb_cas_u64(uint64_t *p, uint64_t expected, uint64_t desired)
    int64_t tsb_load_i64_acquire(const int64_t *p)
    int64_t tsb_load_i64(const int64_t *p)
    void tsb_store_i64_release(int64_t *p, int64_t v)
    void tsb_store_i64(int64_t *p, int64_t v)
    bint tsb_cas_i64(int64_t *p, int64_t expected, int64_t desired)
    uint32_t tsb_load_u32(const uint32_t *p)
    void tsb_store_u32(uint32_t *p, uint32_t v)
    double tsb_load_f64(const double *p)
    void tsb_store_f64(double *p, double v)
    void tsb_load_bytes(char *dst, const char *src, size_t n)
    void tsb_store_bytes(char *dst, const char *src, size_t n)
    void tsb_fence_acquire()

cdef enum:
    FRONTEND_ID_BYTES = 32  # NUL-terminated, so ids hold at most 31 bytes of UTF-8


# The engine's stats group: written under header.seq, read as one consistent snapshot.
ctypedef struct engine_stats:
    uint32_t state
    uint32_t running
    uint32_t waiting
    uint32_t blocks_total
    uint32_t blocks_used
    uint32_t blocks_cached
    double drain_rate  # requests finished per second, recent
    uint64_t ticks
    uint32_t embed_waiting  # embedding requests queued (not yet in a part)


# 128 bytes, so that the slots after it start 64-byte aligned (one cache line each).
ctypedef struct board_header:
    uint64_t magic  # written last by the creator: a reader that sees it sees the rest
    uint32_t version
    uint32_t n_frontend_slots
    int64_t engine_pid  # engine_pid and engine_started_ns are written under seq too
    uint64_t engine_started_ns
    uint64_t heartbeat_ns  # monotonic clock; a single atomic field outside the seqlock
    uint64_t seq  # seqlock: odd while the engine writes the fields under it
    engine_stats stats
    uint8_t reserved[32]


# 64 bytes; one writer each: the frontend that claimed it.
ctypedef struct board_slot:
    int64_t pid  # 0: free; SLOT_BUSY: being claimed or released; > 0: owner's pid
    uint64_t heartbeat_ns
    uint32_t pending_requests
    char frontend_id[FRONTEND_ID_BYTES]
    uint8_t reserved[12]


cdef class Board:
    cdef object _path
    cdef object _mm  # the mmap; kept alive while _buf holds its buffer
    cdef Py_buffer _buf
    cdef board_header *_h  # NULL once closed
    cdef board_slot *_slots
    cdef uint32_t _n_slots
    cdef tuple _file_id  # (st_dev, st_ino), so unlink() removes only our own file

    cdef int _map(self, object path, object mm, tuple file_id) except -1
    cdef int _init_header(self, uint32_t n_slots) except -1
    cdef int _check_header(self, Py_ssize_t size) except -1
    cdef board_header *_header(self) except NULL
    cdef board_slot *_slot(self, Py_ssize_t index) except NULL
    cdef int _write_begin(self) except -1
    cdef void _write_end(self) noexcept
    cdef int _read_stats(self, engine_stats *out, int64_t *pid, uint64_t *started) except -1
    cdef object _read_slot(self, Py_ssize_t index)
