# Layout of the block-aligned prefix tree; see radix.pyi for the public contract.


cdef class _Node:
    cdef _Node parent  # None for the root
    cdef dict children  # tuple of block_size token ids -> _Node
    cdef tuple key  # this node's block of tokens (the key under its parent)
    cdef long long block_id  # the id the caller stores this block's KV under; -1 for the root
    cdef Py_ssize_t depth  # block index: tokens [depth * block_size, (depth + 1) * block_size)
    cdef unsigned long long last_used


cdef class RadixTree:
    cdef Py_ssize_t _block_size
    cdef _Node _root
    cdef dict _by_block  # block id -> _Node
    cdef unsigned long long _clock
    # (last_used, block id) of leaves, a min-heap; an entry whose node is gone, has children
    # or was used since is stale and skipped when it comes up (lru_leaf).
    cdef list _leaf_heap

    cdef _Node _below(self, long long parent_block)
    cdef list _walk(self, _Node start, list tokens)
    cdef list _insert_below(self, _Node start, list tokens, list block_ids)
    cdef int _touch(self, _Node deepest) except -1
    cdef int _push_leaf(self, _Node node) except -1
    cdef bint _is_current_leaf(self, tuple entry)
    cdef int _check_insertable(self, list new_ids) except -1
