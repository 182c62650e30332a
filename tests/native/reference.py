"""Pure-Python reference models for the native modules.

Written for clarity, not speed: each keeps the plainest state that defines the behaviour
(lists and dicts), so that property tests can hold the Cython code against it.
"""

from __future__ import annotations


class RefAccountant:
    """Reference for ``kv_blocks.BlockAccountant``: per-block refcount and cached flag."""

    def __init__(self, total: int, block_size: int) -> None:
        self.block_size = block_size
        self.refcounts = [0] * total
        self.cached_flags = [False] * total
        self.lru_order: list[int] = []  # evictable ids, least recently released first

    @property
    def free(self) -> int:
        return sum(1 for b in range(len(self.refcounts)) if self._is_free(b))

    @property
    def used(self) -> int:
        return sum(1 for rc in self.refcounts if rc > 0)

    @property
    def cached(self) -> int:
        return len(self.lru_order)

    def _is_free(self, b: int) -> bool:
        return self.refcounts[b] == 0 and not self.cached_flags[b]

    def _check(self, b: int) -> None:
        if not 0 <= b < len(self.refcounts):
            raise IndexError(b)

    def claim(self, ids: list[int]) -> None:
        """Record an allocation made by the real accountant, checking it only took free ids."""
        assert len(set(ids)) == len(ids), f"duplicate ids in {ids}"
        for b in ids:
            assert self._is_free(b), f"allocated block {b} was not free"
            self.refcounts[b] = 1

    def acquire(self, b: int) -> None:
        self._check(b)
        if self._is_free(b):
            raise ValueError(b)
        if self.refcounts[b] == 0:
            self.lru_order.remove(b)
        self.refcounts[b] += 1

    def release(self, b: int) -> None:
        self._check(b)
        if self.refcounts[b] == 0:
            raise ValueError(b)
        self.refcounts[b] -= 1
        if self.refcounts[b] == 0 and self.cached_flags[b]:
            self.lru_order.append(b)

    def set_cached(self, b: int, cached: bool) -> None:
        self._check(b)
        if cached == self.cached_flags[b]:
            return
        if cached and self.refcounts[b] == 0:
            raise ValueError(b)
        self.cached_flags[b] = cached
        if not cached and self.refcounts[b] == 0:
            self.lru_order.remove(b)

    def evict(self, b: int) -> None:
        self._check(b)
        if b not in self.lru_order:
            raise ValueError(b)
        self.lru_order.remove(b)
        self.cached_flags[b] = False


Row = tuple[int, int, int, bool]  # token, pos, seq_id, logits


class RefBatch:
    """Reference for ``batch_builder.BatchBuilder``: the rows as a list."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.rows: list[Row] = []

    def clear(self) -> None:
        self.rows = []

    def add(self, token: int, pos: int, seq_id: int, logits: bool) -> int:
        if pos < 0 or seq_id < 0:
            raise ValueError("negative")
        if len(self.rows) >= self.capacity:
            raise IndexError("full")
        self.rows.append((token, pos, seq_id, logits))
        return len(self.rows) - 1

    def add_span(
        self, tokens: list[int], start: int, count: int, pos0: int, seq_id: int, last: bool
    ) -> int:
        if count < 1 or start < 0 or start + count > len(tokens) or pos0 < 0 or seq_id < 0:
            raise ValueError("bad span")
        if len(self.rows) + count > self.capacity:
            raise IndexError("full")
        span = tokens[start : start + count]
        self.rows += [(t, pos0 + i, seq_id, False) for i, t in enumerate(span)]
        self.rows[-1] = (*self.rows[-1][:3], last)
        return len(self.rows) - 1
