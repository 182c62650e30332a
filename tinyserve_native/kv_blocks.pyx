"""Logical KV block accountant: refcounts, a free stack and a count of evictable cached blocks.

Every operation is O(1) except ``allocate``, which is O(n) in what it returns. The accountant is
logical only: llama.cpp owns the real KV cells. Which cached block to evict is the radix tree's
to say (``RadixTree.lru_leaf``): only a leaf can go.
"""

from cpython.mem cimport PyMem_Free, PyMem_Malloc
from libc.stdint cimport INT32_MAX, int32_t, uint8_t
from libc.string cimport memset

cdef class BlockAccountant:
    """Tracks which of ``total_blocks`` KV blocks are free, used (shared-aware) or cached."""

    def __cinit__(self, long long total_blocks, long long block_size):
        if total_blocks <= 0 or total_blocks > INT32_MAX:
            raise ValueError(f"total_blocks must be in 1..{INT32_MAX}, got {total_blocks}")
        if block_size <= 0 or block_size > INT32_MAX:
            raise ValueError(f"block_size must be in 1..{INT32_MAX}, got {block_size}")
        cdef size_t n = <size_t>total_blocks
        self._refcount = <int32_t *>PyMem_Malloc(n * sizeof(int32_t))
        self._cached = <uint8_t *>PyMem_Malloc(n * sizeof(uint8_t))
        self._free_stack = <int32_t *>PyMem_Malloc(n * sizeof(int32_t))
        if self._refcount == NULL or self._cached == NULL or self._free_stack == NULL:
            raise MemoryError()
        self._total = <int32_t>total_blocks
        self._block_size = <int32_t>block_size
        memset(self._refcount, 0, n * sizeof(int32_t))
        memset(self._cached, 0, n * sizeof(uint8_t))
        cdef int32_t i
        for i in range(self._total):
            # Lowest ids on top, so a fresh accountant hands out 0, 1, 2, ...
            self._free_stack[i] = self._total - 1 - i
        self._n_free = self._total
        self._n_used = 0
        self._n_cached = 0

    def __dealloc__(self):
        PyMem_Free(self._refcount)
        PyMem_Free(self._cached)
        PyMem_Free(self._free_stack)

    @property
    def total(self) -> int:
        return self._total

    @property
    def block_size(self) -> int:
        return self._block_size

    @property
    def free(self) -> int:
        return self._n_free

    @property
    def used(self) -> int:
        return self._n_used

    @property
    def cached(self) -> int:
        return self._n_cached

    @property
    def available(self) -> int:
        return self._n_free + self._n_cached

    def blocks_for(self, long long n_tokens) -> int:
        """Blocks needed to hold ``n_tokens`` tokens (0 for 0)."""
        if n_tokens < 0:
            raise ValueError(f"n_tokens must be >= 0, got {n_tokens}")
        return (n_tokens + self._block_size - 1) // self._block_size

    def can_allocate(self, long long n) -> bool:
        """Whether ``allocate(n)`` would succeed without evicting."""
        return 0 <= n <= self._n_free

    def allocate(self, long long n) -> list:
        """Take ``n`` free blocks, each with refcount 1."""
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        if n > self._n_free:
            raise ValueError(f"cannot allocate {n} blocks: only {self._n_free} free")
        cdef list ids = []
        cdef int32_t block_id
        cdef long long i
        for i in range(n):
            self._n_free -= 1
            block_id = self._free_stack[self._n_free]
            self._refcount[block_id] = 1
            ids.append(block_id)
        self._n_used += <int32_t>n
        return ids

    def acquire(self, long long block_id) -> None:
        """Add a reference to a used or cached block (a prefix-cache hit pins it)."""
        cdef int32_t b = self._checked_id(block_id)
        cdef int32_t rc = self._refcount[b]
        if rc == 0:
            if not self._cached[b]:
                raise ValueError(f"block {b} is free: allocate it instead of acquiring it")
            # NOTE: a pinned block is no longer evictable: evict() refuses it from now on, so
            # it cannot be taken from under the request that now reads it.
            self._n_cached -= 1
            self._n_used += 1
        elif rc == INT32_MAX:
            raise OverflowError(f"block {b} refcount would overflow")
        self._refcount[b] = rc + 1

    def release(self, long long block_id) -> None:
        """Drop a reference; at zero the block becomes evictable if cached, else free."""
        self._release_one(self._checked_id(block_id))

    def release_all(self, ids) -> None:
        """Release each id in order; stops at the first invalid one (earlier ones stay released)."""
        for block_id in ids:
            self._release_one(self._checked_id(block_id))

    def set_cached(self, long long block_id, bint cached) -> None:
        """Mark a block as held by the prefix cache, or let the cache drop it."""
        cdef int32_t b = self._checked_id(block_id)
        if cached == self._cached[b]:
            return
        if cached:
            if self._refcount[b] == 0:
                raise ValueError(f"block {b} is free: it holds no KV data to cache")
            self._cached[b] = 1
            return
        self._cached[b] = 0
        if self._refcount[b] == 0:
            self._n_cached -= 1
            self._push_free(b)

    def evict(self, long long block_id) -> None:
        """Free an evictable block (cached, refcount 0)."""
        cdef int32_t b = self._checked_id(block_id)
        if self._refcount[b] != 0 or not self._cached[b]:
            raise ValueError(
                f"block {b} is not evictable (refcount {self._refcount[b]}, "
                f"cached {bool(self._cached[b])})"
            )
        self._cached[b] = 0
        self._n_cached -= 1
        self._push_free(b)

    def refcount(self, long long block_id) -> int:
        """References held on a block."""
        return self._refcount[self._checked_id(block_id)]

    def is_cached(self, long long block_id) -> bool:
        """Whether the prefix cache holds a block."""
        return bool(self._cached[self._checked_id(block_id)])

    def __repr__(self) -> str:
        return (
            f"BlockAccountant(total={self._total}, block_size={self._block_size}, "
            f"free={self._n_free}, used={self._n_used}, cached={self._n_cached})"
        )

    cdef int32_t _checked_id(self, long long block_id) except -1:
        if block_id < 0 or block_id >= self._total:
            raise IndexError(f"block id {block_id} out of range 0..{self._total - 1}")
        return <int32_t>block_id

    cdef int _release_one(self, int32_t b) except -1:
        cdef int32_t rc = self._refcount[b]
        if rc == 0:
            raise ValueError(f"block {b} has no reference to release")
        self._refcount[b] = rc - 1
        if rc > 1:
            return 0
        self._n_used -= 1
        if self._cached[b]:
            self._n_cached += 1
        else:
            self._push_free(b)
        return 0

    cdef void _push_free(self, int32_t b) noexcept:
        self._free_stack[self._n_free] = b
        self._n_free += 1
