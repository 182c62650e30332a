"""The prefix cache: the KV of finished sequences' full blocks, kept in host memory.

Each running sequence attends over its own slot's cells only, so cached prefixes cannot live
among them (a shared pool of cells makes every sequence attend over every other's, and over
whatever is parked there). When a request ends, the full blocks of what its slot holds that
the cache does not have yet are copied out of llama.cpp (one ``llama_state_seq_get_data`` of
the slot, cut into blocks by ``kv_state``) into an arena of block rows; a radix tree maps each
cached prefix to its rows. A later prompt that starts the same way gets those rows joined into
one saved state and written into its slot (``llama_state_seq_set_data``): a copy of a few
microseconds a token against milliseconds a token to prefill (``bench/host_cache.py``).

The arena is one block of virtual memory allocated at start; the kernel gives it pages only
as blocks are first written, so a cache that is not used costs no memory. When it is full,
the least recently used leaf blocks go (a block is useless without the prefix above it).

Rows are accounted by a ``kv_blocks.BlockAccountant``: a row in the tree is cached (evictable)
unless a request is reading it (pinned for the call).
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import time
from collections import Counter
from collections.abc import Callable, Iterator
from collections.abc import Sequence as Tokens
from dataclasses import dataclass, field

import numpy as np

from tinyserve.engine.kv.kv_state import Bytes, StateLayout
from tinyserve_native.kv_blocks import BlockAccountant
from tinyserve_native.radix import RadixTree

log = logging.getLogger(__name__)

TIER_SLOT = "slot"  # the cells a free slot kept of its last request
TIER_HOST = "host"  # blocks in host memory, written there at a finish
TIER_DISK = "disk"  # blocks in host memory that were read from --cache-dir at start
MISS_SHORT = "short"  # the prompt has no full block before its last token
MISS_NO_MATCH = "no_match"  # nothing cached starts this way


@dataclass(frozen=True)
class Hit:
    """What the cache holds of a prompt: ``block_ids`` (full blocks), then, when
    ``partial`` > 0, one more block (or tail) whose first ``partial`` tokens it shares."""

    n_tokens: int = 0  # full blocks and partial tokens together
    block_ids: tuple[int, ...] = ()
    partial: int = 0
    disk_tokens: int = 0  # of n_tokens, those in blocks read from disk at start


NO_HIT = Hit()


@dataclass
class CacheStats:
    """Running totals for metrics (increments are taken by ``EngineMeter``)."""

    lookups: int = 0
    lookup_tokens: int = 0
    hit_tokens: Counter[str] = field(default_factory=Counter)  # reused, by tier
    misses: Counter[str] = field(default_factory=Counter)  # grants that reused nothing
    stored_blocks: int = 0
    evicted_blocks: int = 0
    restored_tokens: int = 0
    restore_ns: int = 0
    store_ns: int = 0
    blocks_held: int = 0  # a gauge: blocks the host arena holds now
    bytes_held: int = 0  # a gauge: their bytes


class HostCache:
    """Full blocks of finished sequences, by prefix, in an arena of rows of host memory."""

    def __init__(
        self,
        layout: StateLayout,
        block_size: int,
        capacity_bytes: int,
        stats: CacheStats | None = None,
    ) -> None:
        self.layout = layout
        self.block_size = block_size
        self.block_bytes = block_size * layout.cell_bytes
        rows = capacity_bytes // self.block_bytes
        if rows < 1:
            raise ValueError(f"{capacity_bytes} bytes hold no block of {self.block_bytes}")
        self.arena: Bytes = _arena(rows, self.block_bytes)
        self.blocks = BlockAccountant(rows, block_size)
        self.tree = RadixTree(block_size)
        self.from_disk = np.zeros(rows, bool)
        self.stats = stats or CacheStats()  # carried over when the cache is emptied
        self._gauge()
        self._state: Bytes = np.empty(0, np.uint8)  # the joined state, reused

    # -- a prompt comes -----------------------------------------------------------------------

    def lookup(self, prompt: Tokens[int]) -> Hit:
        """The longest cached prefix of ``prompt`` short of its last token (whose logits the
        first generated token needs): full blocks, then the most of the next block that a
        cached block or tail below them starts with. Marks them recently used."""
        bs = self.block_size
        usable = (len(prompt) - 1) // bs * bs
        match = self.tree.match(list(prompt[:usable]))
        ids = list(match.block_ids)
        parent = ids[-1] if ids else -1
        end = min(match.n_tokens + bs - 1, len(prompt) - 1)
        partial, block = self.tree.partial(parent, list(prompt[match.n_tokens : end]))
        if partial:
            ids.append(block)
        n_tokens = match.n_tokens + partial
        if not n_tokens:
            return NO_HIT
        disk = int(self.from_disk[ids].sum()) * bs
        return Hit(n_tokens, tuple(ids), partial, min(disk, n_tokens))

    def peek(self, prompt: Tokens[int]) -> int:
        """Full-block tokens the cache holds of ``prompt`` (for estimates; counts nothing)."""
        usable = (len(prompt) - 1) // self.block_size * self.block_size
        return int(self.tree.match(list(prompt[:usable])).n_tokens)

    def restore(self, hit: Hit, load: Callable[[Bytes], bool]) -> bool:
        """Join ``hit``'s blocks into one saved state and hand it to ``load`` (which writes
        it into a slot); False if llama.cpp refused it. Counted as restored on success."""
        started = time.perf_counter_ns()
        size = self.layout.state_bytes(hit.n_tokens)
        if len(self._state) < size:
            self._state = np.empty(size, np.uint8)
        rows = list(hit.block_ids)
        state = self.layout.join(self.arena, rows, self.block_size, hit.n_tokens, self._state)
        if not load(state):
            return False
        stats = self.stats
        stats.restored_tokens += hit.n_tokens
        stats.restore_ns += time.perf_counter_ns() - started
        stats.hit_tokens[TIER_DISK] += hit.disk_tokens
        stats.hit_tokens[TIER_HOST] += hit.n_tokens - hit.disk_tokens
        return True

    # -- a request ends -----------------------------------------------------------------------

    def store(self, tokens: Tokens[int], save: Callable[[], Bytes]) -> int:
        """Keep what the cache does not hold yet of ``tokens`` (positions 0..n-1 of a slot):
        its full blocks, then its tail (the partial block after them, so that a later prompt
        reuses every token a slot would have), as many as room can be made for; ``save`` gives
        the slot's saved state, asked for only when there is something new. Returns rows
        added."""
        bs = self.block_size
        n_full = len(tokens) // bs
        full, tail = list(tokens[: n_full * bs]), list(tokens[n_full * bs :])
        known = self.tree.match(full)
        first = len(known.block_ids)
        parent = known.block_ids[-1] if first else -1
        n_new = n_full - first
        # A tail below known blocks may already be there, or inside a block that is.
        want_tail = bool(tail) and (n_new > 0 or self.tree.partial(parent, tail)[0] < len(tail))
        if not n_new and not want_tail:
            return 0
        started = time.perf_counter_ns()
        room = self._room_below(known.block_ids, n_new + want_tail)
        n_blocks = min(n_new, room)
        with_tail = want_tail and room > n_new
        if not n_blocks and not with_tail:
            return 0
        rows = self.blocks.allocate(n_blocks + with_tail)
        cells = n_blocks * bs + (len(tail) if with_tail else 0)
        self.layout.cut(save(), first * bs, cells, self.arena, rows, bs)
        self.tree.extend(parent, full[first * bs : (first + n_blocks) * bs], rows[:n_blocks])
        if with_tail:
            self.tree.add_tail(rows[n_blocks - 1] if n_blocks else parent, tail, rows[-1])
        self.from_disk[rows] = False
        self._hold(rows)
        self.stats.stored_blocks += len(rows)
        self.stats.store_ns += time.perf_counter_ns() - started
        return len(rows)

    def adopt(self, parent: int, tokens: Tokens[int], kv: bytes, from_disk: bool) -> int:
        """Put one block (or tail) read back from disk below ``parent`` (-1: the root);
        returns its row, -1 when there is no free row (a disk load never evicts what it
        loaded)."""
        if not self.blocks.can_allocate(1) or len(kv) != self.block_bytes:
            return -1
        (row,) = self.blocks.allocate(1)
        self.arena[row] = np.frombuffer(kv, np.uint8)
        if len(tokens) == self.block_size:
            self.tree.extend(parent, list(tokens), [row])
        else:
            self.tree.add_tail(parent, list(tokens), row)
        self.from_disk[row] = from_disk
        self._hold([row])
        return row

    def held(self) -> Iterator[int]:
        """Every row the tree holds, shallow blocks first, the most recently used first
        among equals."""
        tree = self.tree
        rows = [row for row in range(self.blocks.total) if row in tree]
        return iter(sorted(rows, key=lambda row: (tree.depth(row), -tree.last_used(row))))

    # -- bookkeeping --------------------------------------------------------------------------

    def _hold(self, rows: list[int]) -> None:
        for row in rows:
            self.blocks.set_cached(row, True)
            self.blocks.release(row)
        self._gauge()

    def _room_below(self, known: list[int], wanted: int) -> int:
        """Rows for up to ``wanted`` new blocks below ``known`` (which must stay: pinned
        while others are evicted); returns how many there are."""
        for block in known:
            self.blocks.acquire(block)
        try:
            return self._make_room(wanted)
        finally:
            self.blocks.release_all(known)

    def _make_room(self, wanted: int) -> int:
        """Evict least recently used leaves until ``wanted`` rows are free, or nothing more
        can go; returns how many rows are free for it (at most ``wanted``)."""
        while self.blocks.free < wanted:
            victim = self.tree.lru_leaf(self.blocks.refcount)
            if victim < 0:
                break
            self.tree.remove_leaf(victim)
            self.blocks.evict(victim)
            self.stats.evicted_blocks += 1
        self._gauge()
        return min(wanted, self.blocks.free)

    def _gauge(self) -> None:
        self.stats.blocks_held = self.tree.n_nodes
        self.stats.bytes_held = self.tree.n_nodes * self.block_bytes


def _arena(rows: int, row_bytes: int) -> Bytes:
    """Anonymous memory for ``rows`` rows, its pages taken as they are first written, in
    transparent huge pages where the kernel gives them (``madvise``): a 4 KiB page fault
    costs ~9 us on this project's VMs, ~0.8 ms for one block of the default model."""
    memory = mmap.mmap(-1, rows * row_bytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    with contextlib.suppress(AttributeError, OSError):  # no THP: plain pages
        memory.madvise(mmap.MADV_HUGEPAGE)
    return np.frombuffer(memory, np.uint8).reshape(rows, row_bytes)
