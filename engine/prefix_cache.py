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
id is needed. Parking pins the prefix the tree already has while it evicts for a sequence id,
so the new blocks always hang from cached blocks whose cells their holders still have.

With a host tier (``host_cache.HostCache``), an evicted block's KV is copied to host memory
first, and a lookup that runs past the cells continues there: the blocks found are written
back into cells, held by a cache sequence like parked blocks, and are then an ordinary hit.
Both copies go through one scratch sequence id, since llama.cpp saves and restores a whole
sequence's cells (``set_data`` first clears its destination).
"""

from __future__ import annotations

import logging
import time
from collections import Counter, OrderedDict
from collections.abc import Sequence as Tokens
from dataclasses import dataclass, field

from tinyserve.config import Config
from tinyserve.engine.host_cache import ROOT, HostBlock, HostCache, chain_keys
from tinyserve.engine.runtime import LlamaRuntime
from tinyserve.logs import fields
from tinyserve_native.kv_blocks import BlockAccountant
from tinyserve_native.radix import Match, RadixTree

log = logging.getLogger(__name__)

MISS_SHORT = "short"  # the prompt has no full block before its last token
MISS_NO_MATCH = "no_match"  # nothing cached starts this way
MISS_EVICTED = "evicted"  # it was cached once, but evicted since
EVICTED_MEMORY = 4096  # remembered evicted prefixes, for telling MISS_EVICTED from MISS_NO_MATCH
# Restore from host memory only runs of at least this many tokens. Measured (bench/host_cache.py
# (a), busy machine, 1 thread): writing a 16-token block back costs ~0.3 ms against ~185 ms to
# prefill it, 9 ms against 7.1 s for 512 tokens (600-1300x less at every length), with no
# fixed cost beyond the blocks: there is no crossover, every whole block is worth restoring.
RESTORE_MIN_TOKENS = 1


@dataclass(frozen=True)
class Hit:
    """Blocks a request reuses: ``n_tokens`` = len(block_ids) * block_size; pinned."""

    n_tokens: int = 0
    block_ids: list[int] = field(default_factory=list)
    miss: str = ""  # why fewer than all lookup-able blocks were found ("" for a full hit)
    host_tokens: int = 0  # of n_tokens, those written back into cells from host memory
    restore_ns: int = 0  # how long writing them back took


NO_HIT = Hit()


@dataclass
class CacheStats:
    """Counters for metrics: tokens looked up and found, and misses by reason."""

    lookups: int = 0
    lookup_tokens: int = 0
    hit_tokens: int = 0
    misses: Counter[str] = field(default_factory=Counter)
    evicted_blocks: int = 0
    host_saved_blocks: int = 0  # evicted blocks whose KV went to host memory
    host_hit_tokens: int = 0  # of hit_tokens, those restored from host memory
    host_restore_ns: int = 0
    host_bytes: int = 0  # what the host tier holds now (a gauge, not a running total)
    partial_tokens: int = 0  # reused from the start of a cached block after the hit's blocks


class PrefixCache:
    def __init__(
        self,
        runtime: LlamaRuntime,
        blocks: BlockAccountant,
        cache_seqs: range,
        host: HostCache | None = None,
        scratch: int = -1,
        max_cached: int = 0,
    ) -> None:
        assert host is None or scratch >= 0, "the host tier needs a scratch sequence id"
        self.runtime = runtime
        self.max_cached = max_cached  # unreferenced blocks kept in cells (0: no bound)
        self.host = host
        self.scratch = scratch
        self.blocks = blocks
        self.block_size = blocks.block_size
        self.cache_seqs = cache_seqs
        self.tree = RadixTree(self.block_size)
        self.spare_seqs = list(reversed(cache_seqs))
        self.seq_end: dict[int, int] = {}  # cache seq id -> end position of the cells it holds
        self.stats = CacheStats()
        self._evicted: OrderedDict[int, None] = OrderedDict()

    @classmethod
    def from_config(
        cls, config: Config, runtime: LlamaRuntime, blocks: BlockAccountant
    ) -> PrefixCache:
        """The cache ``config`` asks for: ``--cache-seqs`` ids after the slots' and, with
        ``--host-cache-mb``, the host tier and the scratch id after those."""
        seqs = range(config.slots, config.slots + config.cache_seqs)
        bound = -(-config.cache_cells // config.block_size)
        if not config.host_cache:
            return cls(runtime, blocks, seqs, max_cached=bound)
        host = HostCache(config.host_cache_mb * 2**20, config.block_size)
        return cls(runtime, blocks, seqs, host, seqs.stop, bound)

    def reset(self) -> None:
        """Drop every cached prefix: the blocks' cached flags (an unreferenced block becomes
        free), the cache sequences' cells, the tree. Pins stay with whoever holds them; the
        counters carry on (metrics take them as increments). The host tier goes too: its
        blocks were copied from cells the tree named, and the tree is what is in doubt."""
        for block in range(self.blocks.total):
            if self.blocks.is_cached(block):
                self.blocks.set_cached(block, False)
        for seq in self.cache_seqs:
            self.runtime.forget(seq)
        if self.host is not None:  # a copy through the scratch id may have failed halfway
            self.runtime.forget(self.scratch)
            self.host = HostCache(self.host.capacity, self.block_size)
            self.stats.host_bytes = 0
        self.tree = RadixTree(self.block_size)
        self.spare_seqs = list(reversed(self.cache_seqs))
        self.seq_end.clear()
        self._evicted.clear()

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
        self._pin(match.block_ids)
        block_ids, restored, started = list(match.block_ids), [], time.perf_counter_ns()
        if self.host is not None and match.n_tokens < usable:
            restored = self._restore(prompt[:usable], match)
            block_ids += restored
        restore_ns = time.perf_counter_ns() - started if restored else 0
        n_tokens, host_tokens = len(block_ids) * self.block_size, len(restored) * self.block_size
        self.stats.hit_tokens += n_tokens
        self.stats.host_hit_tokens += host_tokens
        self.stats.host_restore_ns += restore_ns
        miss = ""
        if n_tokens < usable:
            next_end = n_tokens + self.block_size
            miss = MISS_EVICTED if _path_key(prompt[:next_end]) in self._evicted else MISS_NO_MATCH
            self.stats.misses[miss] += 1
        return Hit(n_tokens, block_ids, miss, host_tokens, restore_ns)

    def _pin(self, block_ids: list[int]) -> None:
        for block in block_ids:
            self.blocks.acquire(block)

    def make_room(self, n_blocks: int) -> bool:
        """Evict unreferenced cached blocks until ``n_blocks`` are free; False, evicting
        nothing, if even evicting them all would not do."""
        if self.blocks.available < n_blocks:
            return False
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

    def attach_partial(self, hit: Hit, prompt: Tokens[int], slot: int) -> int:
        """Let ``slot`` also see the first tokens of the block after the hit, as many as a
        block cached there starts with (less than a block: a whole one would be in the hit),
        still leaving the prompt's last token to prefill; returns how many. Nothing is pinned:
        llama.cpp frees a cell only when no sequence holds it, so the cells are the slot's
        from here whatever the cache does with the block, and the slot's own blocks already
        count that block whole (its remaining cells are the slot's to fill)."""
        start = hit.n_tokens
        end = min(start + self.block_size - 1, len(prompt) - 1)
        if end <= start:
            return 0
        parent = hit.block_ids[-1] if hit.block_ids else -1
        n, holder = self.tree.partial(parent, list(prompt[start:end]))
        if n:
            self.runtime.share(holder, slot, start, start + n)
            self.stats.partial_tokens += n
        return n

    def park(self, tokens: Tokens[int], block_ids: list[int], slot: int) -> int:
        """Keep the full blocks of ``tokens`` (what ``slot`` holds in the KV cache, block i
        accounted as ``block_ids[i]``) cached after the slot is freed; returns blocks added.
        The caller still releases its references to ``block_ids`` afterwards: the blocks the
        tree took stay cached, the others (copies of blocks it already had) become free.
        One walk down the tree: the match; the new blocks are hung below its last node."""
        n_full = min(len(tokens) // self.block_size, len(block_ids))
        full = list(tokens[: n_full * self.block_size])
        known = self.tree.match(full)
        if len(known.block_ids) == n_full:
            return 0
        # NOTE: the known prefix is pinned while a holder is found: evicting for one must not
        # take the blocks the new ones hang from, or the tree would name this request's blocks
        # (soon free) at their positions, in a sequence that does not hold their cells.
        self._pin(known.block_ids)
        try:
            holder = self._holder_for(known)
            if holder < 0:
                return 0
            return self._adopt(full, block_ids[:n_full], known.block_ids, holder, slot)
        finally:
            self.blocks.release_all(known.block_ids)

    def trim(self) -> int:
        """Evict least recently used blocks until at most ``max_cached`` unreferenced ones
        stay in cells (to host memory when there is a tier); returns how many went. Call
        once the slot that parked is freed: its blocks count only then.

        Why: llama.cpp attends over every cell up to the highest one in use, a parked prefix's
        included, so cached blocks in cells make every decode step of every sequence longer
        (the unified cache's span; ``docs/benchmarks.md``). A bounded number keeps that span
        near what the running sequences need, and the host tier writes a block back for
        ~0.3 ms against ~100x that to prefill it again."""
        evicted = 0
        while self.max_cached and self.blocks.cached > self.max_cached and self._evict_one():
            evicted += 1
        return evicted

    def _holder_for(self, known: Match) -> int:
        """A cache sequence id to hold the blocks after ``known``: the holder of the last
        known block if its cells end there (a conversation growing turn by turn), else a spare
        one; evicts until one of them is there, -1 if nothing more can be evicted."""
        while True:
            if self.seq_end.get(known.seq_id, -1) == known.n_tokens > 0:
                return known.seq_id
            if self.spare_seqs:
                return self.spare_seqs.pop()
            if not self._evict_one():
                return -1

    def _adopt(
        self, tokens: list[int], block_ids: list[int], known: list[int], holder: int, slot: int
    ) -> int:
        """Hang blocks ``len(known)..`` of ``tokens`` below ``known``, ``holder`` owning them
        (``slot``'s own, now cached) and seeing their cells; returns how many."""
        start = len(known) * self.block_size
        self._hang(tokens[start:], block_ids[len(known) :], known, holder)
        self.runtime.share(slot, holder, start, len(tokens))
        return len(block_ids) - len(known)

    def _hang(self, tokens: list[int], new: list[int], known: list[int], holder: int) -> None:
        """Put blocks ``new`` (of ``tokens``) in the tree below ``known``, owned by
        ``holder``, whose cells must end where they start (the caller gives it theirs)."""
        start = len(known) * self.block_size
        parent = known[-1] if known else -1
        kept = self.tree.extend(parent, tokens, new, holder)
        assert kept == new, f"the tree kept {kept}, not our new blocks {new}"
        for block in new:
            self.blocks.set_cached(block, True)
        assert self.seq_end.get(holder, start) == start, f"seq {holder} holds cells past {start}"
        self.seq_end[holder] = start + len(tokens)

    # -- the host tier -----------------------------------------------------------------------

    def _restore(self, tokens: Tokens[int], known: Match) -> list[int]:
        """Write the blocks host memory holds after ``known`` back into cells, held by a
        cache sequence as parked blocks are; returns their new block ids, pinned once (the
        caller's hit). Needs room and a sequence id: evicts for them, else restores none."""
        assert self.host is not None
        bs, first = self.block_size, len(known.block_ids)
        parent = chain_keys(tokens[: known.n_tokens], bs)[-1] if first else ROOT
        run = self.host.run(tokens, first, parent, len(tokens) // bs - first)
        if not run or len(run) * bs < RESTORE_MIN_TOKENS or not self.make_room(len(run)):
            return []
        holder = self._holder_for(known)
        if holder < 0:
            return []
        new = self.blocks.allocate(len(run))
        loaded = self._load_run(run, holder, known.n_tokens)
        self.blocks.release_all(new[loaded:])  # never cached: free again
        if not loaded:
            if holder not in self.tree.seqs_in_use():
                self._release_seq(holder)
            return []
        end = known.n_tokens + loaded * bs
        self._hang(list(tokens[known.n_tokens : end]), new[:loaded], known.block_ids, holder)
        return new[:loaded]

    def _load_run(self, run: list[HostBlock], holder: int, start: int) -> int:
        """Give ``holder`` the cells of ``run``'s blocks from position ``start``, one block
        at a time through the scratch sequence; returns how many blocks it got. A block
        llama.cpp refuses ends the run and leaves host memory."""
        assert self.host is not None
        for i, block in enumerate(run):
            pos = start + i * self.block_size
            assert block.depth * self.block_size == pos, "a host block at the wrong depth"
            loaded = self.runtime.load_seq(self.scratch, block.kv)
            if loaded:
                self.runtime.share(self.scratch, holder, pos, pos + self.block_size)
            self.runtime.forget(self.scratch)
            if not loaded:
                log.warning("host cache block refused by llama.cpp, dropped", extra=fields(pos=pos))
                self.host.discard(block.key)
                self.stats.host_bytes = self.host.bytes
                return i
        return len(run)

    def _save(self, path: list[int], seq: int) -> None:
        """Copy the KV of the block ending ``path`` (``seq`` sees its cells) to host memory,
        unless it is there already (restored earlier, or saved by ``spill``)."""
        assert self.host is not None
        bs, end = self.block_size, len(path)
        keys = chain_keys(path, bs)
        if self.host.touch(keys[-1]):
            return
        self.runtime.share(seq, self.scratch, end - bs, end)
        kv = self.runtime.save_seq(self.scratch)
        self.runtime.forget(self.scratch)
        parent = keys[-2] if len(keys) > 1 else ROOT
        if self.host.put(HostBlock(parent, tuple(path[-bs:]), kv, len(keys) - 1)):
            self.stats.host_saved_blocks += 1
            self.stats.host_bytes = self.host.bytes

    def spill(self) -> int:
        """Copy every cached block still in cells to host memory as well (to be written to
        disk at drain); deepest first, so that when the bound drops some, the shallow ones,
        shared by more prompts, stay. Returns the blocks in the tree."""
        if self.host is None:
            return 0
        paths = {b: self.tree.path_tokens(b) for b in range(self.blocks.total) if b in self.tree}
        for block in sorted(paths, key=lambda b: -len(paths[b])):
            self._save(paths[block], self.tree.owner(block))
        return len(paths)

    # -- eviction ----------------------------------------------------------------------------

    def _evict_one(self) -> bool:
        """Evict the least recently used unreferenced leaf block; False if there is none."""
        victim = self.tree.lru_leaf(self.blocks.refcount)
        if victim < 0:
            return False
        path = self.tree.path_tokens(victim)
        seq, start, end = self.tree.remove_leaf(victim)
        if self.host is not None:
            self._save(path, seq)
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
