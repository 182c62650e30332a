# Layout of the logical KV block accountant; see kv_blocks.pyi for the public contract.

from libc.stdint cimport int32_t, uint8_t

cdef class BlockAccountant:
    cdef int32_t _total
    cdef int32_t _block_size
    # Per block, indexed by block id.
    cdef int32_t *_refcount
    cdef uint8_t *_cached
    # Free blocks (refcount 0, not cached) as a stack; _n_free is its height.
    cdef int32_t *_free_stack
    cdef int32_t _n_free
    cdef int32_t _n_used
    cdef int32_t _n_cached

    cdef int32_t _checked_id(self, long long block_id) except -1
    cdef void _push_free(self, int32_t block_id) noexcept
    cdef int _release_one(self, int32_t block_id) except -1
