"""Where each request's KV lives: its slot's cells, and the prefix cache in host memory.

Every slot has a stream of KV cells of its own (``--ctx-per-slot``), over which its sequence
alone attends. ``KvSpace`` is the scheduler's one door to KV state:

- **At the grant** it picks the free slot and what the request reuses there, among the free
  slots that keep the running sequences' ids together (llama.cpp decodes in one pass only rows
  of consecutive sequence ids: ``resident.py``). A free slot keeps the cells of its last
  request (``SlotPrefixes``): a prompt that starts like them, a conversation's next turn above
  all, goes to that slot and moves nothing. Otherwise the prefix cache (``HostCache``) may hold
  more of the prompt's start: its blocks are joined into one saved state and written into the
  slot whose cells matter least.
- **At the finish** the slot's full blocks go to the cache (those it does not hold yet), and
  the slot keeps its cells for the next grant. After a failure the cells are dropped.

A cache step that fails is logged and the cache is emptied (its tree and arena may disagree):
the request it happened to keeps its outcome; later ones prefill until it fills again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from tinyserve import capacity
from tinyserve.config import Config
from tinyserve.engine.kv.host_cache import (
    MISS_NO_MATCH,
    MISS_SHORT,
    NO_HIT,
    TIER_DISK,
    TIER_HOST,
    TIER_SLOT,
    CacheStats,
    Hit,
    HostCache,
)
from tinyserve.engine.kv.kv_state import Bytes, StateFormatError, StateLayout
from tinyserve.engine.kv.resident import SlotPrefixes
from tinyserve.engine.request import prompt_logprobs
from tinyserve.engine.request.sequence import Sequence
from tinyserve.engine.runtime.runtime import LlamaRuntime
from tinyserve.logs import fields

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Reuse:
    """What a granted request found in its slot: ``tokens`` of its prompt, from ``tier``
    (``host_cache.TIER_*``; "" for nothing), written there in ``ns`` (0: nothing moved)."""

    slot: int
    tokens: int = 0
    tier: str = ""
    ns: int = 0


class KvSpace:
    """The slots' kept cells and the prefix cache, for the scheduler."""

    def __init__(self, config: Config, runtime: LlamaRuntime) -> None:
        self.runtime = runtime
        self.block_size = config.block_size
        self.n_slots = config.slots
        self.kept = SlotPrefixes(config.slots, config.block_size)
        self.reuse = config.prefix_cache  # off: every request prefills its whole prompt
        self.stats = CacheStats()
        self.cache: HostCache | None = None
        self._capacity = config.host_cache_mb * 2**20
        if config.prefix_cache and self._capacity:
            self.cache = _open_cache(runtime, config.block_size, self._capacity, self.stats)

    def hint(self, prompt: list[int]) -> int:
        """Prompt tokens the cache holds now (an estimate for the policy; counts nothing)."""
        return self.cache.peek(prompt) if self.cache else 0

    def grant(self, seq: Sequence, free: list[int]) -> Reuse:
        """Choose ``seq``'s slot among ``free`` and put in its cells what it reuses."""
        # a follower takes its leader's cells and a request that wants prompt logprobs
        # prefills every position (cached positions have no logits): neither reuses.
        offered = self.kept.offered(free)
        if not self.reuse:
            return self._keep(self.kept.spare(offered), 0)
        if seq.leader is not None or prompt_logprobs.wanted(seq):
            seq.timeline.prefix_recomputed = self.hint(seq.request.prompt_ids)
            return self._keep(self.kept.spare(offered), 0)
        prompt = seq.request.prompt_ids
        slot, kept = self.kept.choose(prompt, offered)
        hit = self._call(seq, "looking the prompt up", lambda c: c.lookup(prompt), NO_HIT)
        reuse = None
        if hit.n_tokens > kept:
            target = self.kept.spare(offered)
            reuse = self._restore(seq, target, hit)
            if reuse is None and target == slot:
                kept = 0  # the refused state took the slot's cells with it
        reuse = reuse or self._keep(slot, kept)
        self._count(prompt, reuse)
        return reuse

    def finish(self, seq: Sequence, served: bool) -> None:
        """``seq`` leaves its slot: when ``served`` (not after a failure, which may have left
        its cells wrong), its full blocks go to the cache and the slot keeps its cells."""
        if not served or not self.reuse:
            self.runtime.forget(seq.slot)
            self.kept.keep(seq.slot, [])
            return
        # Cells past its tokens: guesses of its last step (engine/request/speculation.py) that a
        # stop string or max_tokens left untaken.
        self.runtime.forget(seq.slot, seq.n_past)
        tokens = seq.kv_tokens()
        self._call(seq, "caching its prefix", lambda c: c.store(tokens, self._saver(seq)), 0)
        self.kept.keep(seq.slot, tokens)

    def blocks(self, running: list[Sequence]) -> tuple[int, int, int]:
        """KV blocks of all slots' cells, those running requests fill, those free slots keep."""
        per_slot = self.runtime.n_ctx_seq // self.block_size
        used = sum(capacity.blocks_needed(s.n_past, self.block_size) for s in running)
        taken = {s.slot for s in running}
        kept = sum(
            capacity.blocks_needed(len(tokens), self.block_size)
            for slot, tokens in enumerate(self.kept.tokens)
            if slot not in taken
        )
        return per_slot * self.n_slots, used, kept

    def _count(self, prompt: list[int], reuse: Reuse) -> None:
        stats = self.stats
        stats.lookups += 1
        stats.lookup_tokens += max(len(prompt) - 1, 0)
        if reuse.tier == TIER_SLOT:
            stats.hit_tokens[TIER_SLOT] += reuse.tokens
        elif not reuse.tier:
            stats.misses[MISS_SHORT if len(prompt) <= self.block_size else MISS_NO_MATCH] += 1

    # -- the two ways a slot is filled ------------------------------------------------------

    def _keep(self, slot: int, tokens: int) -> Reuse:
        """``slot`` keeps the first ``tokens`` of its cells for the request; the rest go."""
        self.kept.take(slot)
        self.runtime.forget(slot, tokens)
        return Reuse(slot, tokens, TIER_SLOT if tokens else "")

    def _restore(self, seq: Sequence, slot: int, hit: Hit) -> Reuse | None:
        """Write ``hit``'s blocks into ``slot``; None (the slot untouched) if that failed."""
        started = time.perf_counter_ns()

        def load(cache: HostCache) -> bool:
            return cache.restore(hit, lambda state: self.runtime.load_seq(slot, state))

        if not self._call(seq, "restoring its prefix", load, False):
            # llama.cpp dropped the slot's cells before it read the state, and refused it.
            log.warning("prefix cache restore refused", extra=fields(request_id=seq.request_id))
            self.runtime.forget(slot)
            self.kept.take(slot)
            return None
        self.kept.take(slot)
        tier = TIER_DISK if hit.disk_tokens * 2 > hit.n_tokens else TIER_HOST
        return Reuse(slot, hit.n_tokens, tier, time.perf_counter_ns() - started)

    def _saver(self, seq: Sequence) -> Callable[[], Bytes]:
        return lambda: self.runtime.save_seq(seq.slot)

    def _call(self, seq: Sequence, what: str, step: Callable[[HostCache], T], failed: T) -> T:
        """A cache step for ``seq``. The cache failing is no failure of the request: it is
        logged, the cache emptied (its tree and arena may no longer agree), ``failed`` given."""
        cache = self.cache
        if cache is None:
            return failed
        try:
            return step(cache)
        except Exception as exc:
            log.error(
                "prefix cache failed while %s; it was emptied",
                what,
                exc_info=exc,
                extra=fields(request_id=seq.request_id),
            )
            self.cache = HostCache(cache.layout, self.block_size, self._capacity, self.stats)
            return failed


def _open_cache(
    runtime: LlamaRuntime, block_size: int, capacity_bytes: int, stats: CacheStats
) -> HostCache | None:
    """The prefix cache, or None (with one line saying why) when this model's saved state is
    not one ``kv_state`` can cut into blocks."""
    try:
        layout = probe_layout(runtime, block_size)
    except StateFormatError as exc:
        log.warning("prefix cache off: this model's KV state cannot be cut into blocks (%s)", exc)
        return None
    cache = HostCache(layout, block_size, capacity_bytes, stats)
    log.info(
        "prefix cache: %d blocks of %d tokens in %.0f MiB of host memory",
        cache.blocks.total,
        block_size,
        capacity_bytes / 2**20,
    )
    return cache


def probe_layout(runtime: LlamaRuntime, block_size: int) -> StateLayout:
    """Decode one block into slot 0, read the state layout off its saved state, and check that
    cutting and joining gives the same bytes back and that llama.cpp takes them."""
    batch = runtime.batch
    batch.clear()
    batch.add_span(list(range(block_size)), 0, block_size, 0, 0, False)
    if runtime.decode() != 0:
        raise StateFormatError("the probe's decode failed")
    try:
        state = runtime.save_seq(0).copy()
        layout = StateLayout.read(state.tobytes(), runtime.n_layer)
        arena = np.empty((1, block_size * layout.cell_bytes), np.uint8)
        layout.cut(state, 0, block_size, arena, [0], block_size)
        out = np.empty(layout.state_bytes(block_size), np.uint8)
        if not np.array_equal(layout.join(arena, [0], block_size, block_size, out), state):
            raise StateFormatError("a state cut into blocks and joined is not the same state")
        if not runtime.load_seq(0, out):
            raise StateFormatError("llama.cpp refused a joined state")
    finally:
        runtime.clear()
    return layout
