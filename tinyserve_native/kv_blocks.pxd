# Layout of the logical KV block accountant; see kv_blocks.pyi for the public contract.

from libc.stdint cimport int32_t, uint8_t

# Ends the LRU list (no previous / next block).
cdef enum:
    NIL = -1


cdef class BlockAccountant:
    cdef int32_t _total
    cdef int32_t _block_size
    # Per block, indexed by block id.
    cdef int32_t *_refcount
    cdef uint8_t *_cached
    # Intrusive doubly-linked LRU of evictable blocks (cached, refcount 0); -1 ends the list.
    cdef int32_t *_prev
    cdef int32_t *_next
    cdef int32_t _head  # least recently released
    cdef int32_t _tail  # most recently released
    # Free blocks (refcount 0, not cached) as a stack; _n_free is its height.
    cdef int32_t *_free_stack
    cdef int32_t _n_free
    cdef int32_t _n_used
    cdef int32_t _n_cached

    cdef int32_t _checked_id(self, long long block_id) except -1
    cdef void _lru_push_tail(self, int32_t block_id) noexcept
    cdef void _lru_unlink(self, int32_t block_id) noexcept
    cdef void _push_free(self, int32_t block_id) noexcept
    cdef int _release_one(self, int32_t block_id) except -1
