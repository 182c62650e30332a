"""The prefix cache: full KV blocks of finished sequences stay in llama.cpp for reuse.

When a request ends, the full blocks of what its sequence holds (prompt and generated tokens)
are inserted into a radix tree and their cells re-tagged with a spare llama.cpp sequence id
(``llama_memory_seq_cp``: in a unified KV cache this adds a tag, it copies nothing), so they
outlive the slot. A later request whose prompt starts with the same blocks gets their cells
tagged with its slot instead of prefilling them.

Accounting is sharing-aware: a cached block is one kv_blocks id whatever number of sequences
see it; a request pins (acquires) the blocks it reuses when it is accepted and is charged only
for the rest. Unreferenced cached blocks are evictable: they count as available, and are
evicted leaf first, least recently used first, when a request needs room or a spare sequence
id is needed.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Sequence as Tokens
from dataclasses import dataclass, field

from tinyserve.engine.runtime import LlamaRuntime
from tinyserve_native.kv_blocks import BlockAccountant
from tinyserve_native.radix import RadixTree

MISS_SHORT = "short"  # the prompt has no full block before its last token
MISS_NO_MATCH = "no_match"  # nothing cached starts this way
MISS_EVICTED = "evicted"  # it was cached once, but evicted since
EVICTED_MEMORY = 4096  # remembered evicted prefixes, for telling MISS_EVICTED from MISS_NO_MATCH


@dataclass(frozen=True)
class Hit:
    """Blocks a request reuses: ``n_tokens`` = len(block_ids) * block_size; pinned."""

    n_tokens: int = 0
    block_ids: list[int] = field(default_factory=list)
    miss: str = ""  # why fewer than all lookup-able blocks were found ("" for a full hit)


NO_HIT = Hit()


@dataclass
class CacheStats:
    """Counters for metrics: tokens looked up and found, and misses by reason."""

    lookups: int = 0
    lookup_tokens: int = 0
    hit_tokens: int = 0
    misses: Counter[str] = field(default_factory=Counter)
    evicted_blocks: int = 0


class PrefixCache:
    def __init__(
        self,
        runtime: LlamaRuntime,
        blocks: BlockAccountant,
        cache_seqs: range,
    ) -> None:
        self.runtime = runtime
        self.blocks = blocks
        self.block_size = blocks.block_size
        self.tree = RadixTree(self.block_size)
        self.spare_seqs = list(reversed(cache_seqs))
        self.seq_end: dict[int, int] = {}  # cache seq id -> end position of the cells it holds
        self.stats = CacheStats()
        self._evicted: OrderedDict[int, None] = OrderedDict()

    # -- lookup at acceptance ----------------------------------------------------------------

    def lookup(self, prompt: Tokens[int]) -> Hit:
        """The longest cached full-block prefix of ``prompt``, leaving at least its last token
        to prefill (it must produce the logits of the first generated token); pinned."""
        usable = (len(prompt) - 1) // self.block_size * self.block_size
        self.stats.lookups += 1
        self.stats.lookup_tokens += usable
        if usable == 0:
            self.stats.misses[MISS_SHORT] += 1
            return Hit(miss=MISS_SHORT)
        match = self.tree.match(list(prompt[:usable]))
        for block in match.block_ids:
            self.blocks.acquire(block)
        self.stats.hit_tokens += match.n_tokens
        miss = ""
        if match.n_tokens < usable:
            next_end = match.n_tokens + self.block_size
            miss = MISS_EVICTED if _path_key(prompt[:next_end]) in self._evicted else MISS_NO_MATCH
            self.stats.misses[miss] += 1
        return Hit(match.n_tokens, list(match.block_ids), miss)

    def unpin(self, hit: Hit) -> None:
        """Give back a hit's pins (the request was rejected or ended)."""
        self.blocks.release_all(hit.block_ids)

    def make_room(self, n_blocks: int) -> bool:
        """Evict unreferenced cached blocks until ``n_blocks`` are free; False if impossible."""
        while self.blocks.free < n_blocks:
            if not self._evict_one():
                return False
        return True

    # -- slot grant and finish ---------------------------------------------------------------

    def attach(self, hit: Hit, slot: int) -> None:
        """Let ``slot`` see the hit's cells, each run of blocks from the sequence holding it."""
        start = 0
        for owner, count in _runs([self.tree.owner(b) for b in hit.block_ids]):
            end = start + count * self.block_size
            self.runtime.share(owner, slot, start, end)
            start = end

    def park(self, tokens: Tokens[int], block_ids: list[int], slot: int) -> int:
        """Keep the full blocks of ``tokens`` (what ``slot`` holds in the KV cache, block i
        accounted as ``block_ids[i]``) cached after the slot is freed; returns blocks added.
        The caller still releases its references to ``block_ids`` afterwards."""
        n_full = min(len(tokens) // self.block_size, len(block_ids))
        first_new = self._known_prefix(tokens, n_full)
        if first_new == n_full:
            return 0
        holder = self._holder_for(tokens, first_new)
        if holder < 0:
            return 0
        size = self.block_size
        kept = self.tree.insert(list(tokens[: n_full * size]), block_ids[:n_full], holder)
        added = [i for i in range(first_new, n_full) if kept[i] == block_ids[i]]
        for i in added:
            self.blocks.set_cached(block_ids[i], True)
        if added:
            start, end = added[0] * size, (added[-1] + 1) * size
            self.runtime.share(slot, holder, start, end)
            self.seq_end[holder] = max(self.seq_end.get(holder, 0), end)
        elif holder not in self.tree.seqs_in_use():
            self._release_seq(holder)
        return len(added)

    def _known_prefix(self, tokens: Tokens[int], n_full: int) -> int:
        """How many of the first ``n_full`` blocks of ``tokens`` the tree already has."""
        return self.tree.match(list(tokens[: n_full * self.block_size])).n_tokens // self.block_size

    def _holder_for(self, tokens: Tokens[int], first_new: int) -> int:
        """A cache sequence id to hold blocks ``first_new..``: the parent block's holder if it
        holds nothing beyond (a conversation growing turn by turn), else a spare one."""
        if first_new > 0:
            parent = self.tree.match(list(tokens[: first_new * self.block_size])).block_ids[-1]
            owner = self.tree.owner(parent)
            if self.seq_end.get(owner) == first_new * self.block_size:
                return owner
        while not self.spare_seqs:
            if not self._evict_one():
                return -1
        return self.spare_seqs.pop()

    # -- eviction ----------------------------------------------------------------------------

    def _evict_one(self) -> bool:
        """Evict the least recently used unreferenced leaf block; False if there is none."""
        victim = next((b for b in self.tree.leaves_lru() if self.blocks.refcount(b) == 0), None)
        if victim is None:
            return False
        path = self.tree.path_tokens(victim)
        seq, start, end = self.tree.remove_leaf(victim)
        self.runtime.forget(seq, start, end)
        self.blocks.evict(victim)
        self.stats.evicted_blocks += 1
        self._remember_evicted(_path_key(path))
        if self.seq_end.get(seq) == end:
            self.seq_end[seq] = start
        if seq not in self.tree.seqs_in_use():
            self._release_seq(seq)
        return True

    def _release_seq(self, seq: int) -> None:
        self.runtime.forget(seq)
        self.seq_end.pop(seq, None)
        self.spare_seqs.append(seq)

    def _remember_evicted(self, key: int) -> None:
        self._evicted[key] = None
        self._evicted.move_to_end(key)
        if len(self._evicted) > EVICTED_MEMORY:
            self._evicted.popitem(last=False)


def _path_key(tokens: Tokens[int]) -> int:
    return hash(tuple(tokens))


def _runs(owners: list[int]) -> list[tuple[int, int]]:
    """``[a, a, b]`` -> ``[(a, 2), (b, 1)]``."""
    runs: list[tuple[int, int]] = []
    for owner in owners:
        if runs and runs[-1][0] == owner:
            runs[-1] = (owner, runs[-1][1] + 1)
        else:
            runs.append((owner, 1))
    return runs
