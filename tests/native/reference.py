"""Pure-Python reference models for the native modules.

Written for clarity, not speed: each keeps the plainest state that defines the behaviour
(lists and dicts), so that property tests can hold the Cython code against it.
"""

from __future__ import annotations

from collections.abc import Callable


class RefAccountant:
    """Reference for ``kv_blocks.BlockAccountant``: per-block refcount and cached flag."""

    def __init__(self, total: int, block_size: int) -> None:
        self.block_size = block_size
        self.refcounts = [0] * total
        self.cached_flags = [False] * total
        self.evictable: list[int] = []  # cached ids with refcount 0, in no particular order

    @property
    def free(self) -> int:
        return sum(1 for b in range(len(self.refcounts)) if self._is_free(b))

    @property
    def used(self) -> int:
        return sum(1 for rc in self.refcounts if rc > 0)

    @property
    def cached(self) -> int:
        return len(self.evictable)

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
            self.evictable.remove(b)
        self.refcounts[b] += 1

    def release(self, b: int) -> None:
        self._check(b)
        if self.refcounts[b] == 0:
            raise ValueError(b)
        self.refcounts[b] -= 1
        if self.refcounts[b] == 0 and self.cached_flags[b]:
            self.evictable.append(b)

    def set_cached(self, b: int, cached: bool) -> None:
        self._check(b)
        if cached == self.cached_flags[b]:
            return
        if cached and self.refcounts[b] == 0:
            raise ValueError(b)
        self.cached_flags[b] = cached
        if not cached and self.refcounts[b] == 0:
            self.evictable.remove(b)

    def evict(self, b: int) -> None:
        self._check(b)
        if b not in self.evictable:
            raise ValueError(b)
        self.evictable.remove(b)
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
        self,
        tokens: list[int],
        start: int,
        count: int,
        pos0: int,
        seq_id: int,
        last: bool,
        every: bool = False,
    ) -> int:
        if count < 1 or start < 0 or start + count > len(tokens) or pos0 < 0 or seq_id < 0:
            raise ValueError("bad span")
        if len(self.rows) + count > self.capacity:
            raise IndexError("full")
        span = tokens[start : start + count]
        self.rows += [(t, pos0 + i, seq_id, every) for i, t in enumerate(span)]
        self.rows[-1] = (*self.rows[-1][:3], last or every)
        return len(self.rows) - 1


class RefRadix:
    """Reference for ``radix.RadixTree``: a dict from each cached prefix (a tuple of whole
    blocks of tokens) to ``[block_id, last_used]``.
    """

    def __init__(self, block_size: int) -> None:
        self.bs = block_size
        self.nodes: dict[tuple[int, ...], list[int]] = {}
        self.clock = 0

    def _prefixes(self, tokens: list[int]) -> list[tuple[int, ...]]:
        full = len(tokens) // self.bs
        return [tuple(tokens[: (k + 1) * self.bs]) for k in range(full)]

    def _is_tail(self, key: tuple[int, ...]) -> bool:
        return len(key) % self.bs != 0

    def _matched(self, tokens: list[int]) -> list[tuple[int, ...]]:
        matched = []
        for key in self._prefixes(tokens):
            if key not in self.nodes:
                break
            matched.append(key)
        return matched

    def _touch(self, keys: list[tuple[int, ...]]) -> None:
        self.clock += 1
        for key in keys:
            self.nodes[key][1] = self.clock

    def match(self, tokens: list[int]) -> tuple[int, list[int]]:
        keys = self._matched(tokens)
        if not keys:
            return 0, []
        self._touch(keys)
        return len(keys[-1]), [self.nodes[k][0] for k in keys]

    def insert(self, tokens: list[int], block_ids: list[int]) -> list[int]:
        keys = self._prefixes(tokens)
        if len(tokens) % self.bs or len(block_ids) != len(keys):
            raise ValueError("bad arguments")
        new = [(k, b) for k, b in zip(keys, block_ids, strict=True) if k not in self.nodes]
        new_ids = [b for _, b in new]
        in_tree = {node[0] for node in self.nodes.values()}
        if len(set(new_ids)) != len(new_ids) or in_tree & set(new_ids):
            raise ValueError("cannot insert")
        for key, block_id in new:
            self.nodes[key] = [block_id, 0]
        self._touch(keys)
        return [self.nodes[k][0] for k in keys]

    def _key_of(self, block_id: int) -> tuple[int, ...]:
        for key, node in self.nodes.items():
            if node[0] == block_id:
                return key
        raise KeyError(block_id)

    def _has_children(self, key: tuple[int, ...]) -> bool:
        above = len(key) // self.bs * self.bs if self._is_tail(key) else len(key)
        return not self._is_tail(key) and any(
            above < len(k) <= above + self.bs and k[:above] == key for k in self.nodes
        )

    def is_leaf(self, block_id: int) -> bool:
        return not self._has_children(self._key_of(block_id))

    def remove_leaf(self, block_id: int) -> None:
        key = self._key_of(block_id)
        if self._has_children(key):
            raise ValueError("not a leaf")
        del self.nodes[key]

    def last_used(self, block_id: int) -> int:
        return self.nodes[self._key_of(block_id)][1]

    def depth(self, block_id: int) -> int:
        return (len(self._key_of(block_id)) - 1) // self.bs

    def add_tail(self, parent_block: int, tokens: list[int], block_id: int) -> int:
        above = () if parent_block == -1 else self._key_of(parent_block)
        if self._is_tail(above):
            raise ValueError("a tail has nothing below it")
        if not 0 < len(tokens) < self.bs:
            raise ValueError("bad tail")
        key = above + tuple(tokens)
        if key not in self.nodes:
            if any(node[0] == block_id for node in self.nodes.values()):
                raise ValueError("id in the tree")
            self.nodes[key] = [block_id, 0]
        self._touch([*self._prefixes(list(key)), key])
        return self.nodes[key][0]

    def path_tokens(self, block_id: int) -> list[int]:
        return list(self._key_of(block_id))

    def extend(self, parent_block: int, tokens: list[int], block_ids: list[int]) -> list[int]:
        above = [] if parent_block == -1 else self.path_tokens(parent_block)
        if self._is_tail(tuple(above)):
            raise ValueError("a tail has nothing below it")
        known = [self.nodes[key][0] for key in self._prefixes(above)]
        return self.insert(above + tokens, known + block_ids)[len(known) :]

    def partial(self, parent_block: int, tokens: list[int]) -> tuple[int, int]:
        above = () if parent_block == -1 else self._key_of(parent_block)
        best, found, best_used = 0, -1, 0
        if self._is_tail(above):
            return best, found  # nothing hangs below a tail: a key that extends it is a sibling
        for key, (block_id, used) in self.nodes.items():
            if not len(above) < len(key) <= len(above) + self.bs or key[: len(above)] != above:
                continue
            block = key[len(above) :]
            k = 0
            while k < min(len(tokens), self.bs - 1, len(block)) and block[k] == tokens[k]:
                k += 1
            if k > best or (k == best and k > 0 and used > best_used):
                best, found, best_used = k, block_id, used
        return best, found

    def leaves_lru(self) -> list[int]:
        """Leaf block ids, least recently used first."""
        leaves = [node for key, node in self.nodes.items() if not self._has_children(key)]
        return [node[0] for node in sorted(leaves, key=lambda node: node[1])]

    def lru_leaf(self, refcount: Callable[[int], int]) -> int:
        return next((b for b in self.leaves_lru() if refcount(b) == 0), -1)
