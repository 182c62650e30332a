"""Where each request's KV lives: its blocks, the prefix cache, the cells a slot keeps.

``KvSpace`` is the engine core's one door to KV state. The core schedules (who waits, who
gets a slot, what goes in the batch) and asks this for the KV side of each step: reserve a
request's worst case of blocks (after a prefix-cache lookup or its leader's prompt blocks),
choose and fill a slot's cells at the grant, park a finished request's prefix and give back
what it held. Which of the two KV layouts is in use shows only here: with one pool
(``--kv-layout unified``) the shared prefix cache (``prefix_cache.py``); with a stream per
slot, the cells each slot keeps of its last request (``resident.py``).

A failing prefix-cache operation (``call``) may leave the tree, the cache sequences and the
blocks' cached flags disagreeing: every cached prefix is dropped (``reset``) and the failure
becomes the request's, through ``RequestError``.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

from tinyserve.config import Config
from tinyserve.engine import forks, prompt_logprobs
from tinyserve.engine.prefix_cache import NO_HIT, CacheStats, PrefixCache
from tinyserve.engine.resident import SlotPrefixes
from tinyserve.engine.runtime import LlamaRuntime
from tinyserve.engine.sequence import Sequence, Status
from tinyserve.errors import EngineFatalError, RequestError
from tinyserve.logs import fields
from tinyserve.protocol import FINISH_ERROR
from tinyserve_native.kv_blocks import BlockAccountant

log = logging.getLogger(__name__)

Live = Callable[[], Iterable[Sequence]]  # every request the engine holds
Fail = Callable[[Sequence, str], None]  # end one with an error, detail given


class KvSpace:
    """The block accountant and, per layout, the prefix cache or the slots' kept cells."""

    def __init__(self, config: Config, runtime: LlamaRuntime, live: Live, fail: Fail) -> None:
        self.runtime = runtime
        self.blocks = BlockAccountant(runtime.n_ctx // config.block_size, config.block_size)
        self.cache = (
            PrefixCache.from_config(config, runtime, self.blocks) if config.shared_cache else None
        )
        # --kv-layout slots: each slot's cells are its own; a slot keeps its last prefix.
        slot_kept = config.prefix_cache and not config.shared_cache
        self.resident = SlotPrefixes(config.slots, config.block_size) if slot_kept else None
        self._live = live
        self._fail = fail

    # -- a request's way through ---------------------------------------------------------------

    def reserve(self, seq: Sequence, leader: Sequence | None) -> int | None:
        """Give ``seq`` its worst case of blocks: its leader's prompt blocks or its cached
        prefix's, then blocks of its own; returns how many are its own, or None (holding
        nothing) when the free and evictable blocks are not enough now."""
        if leader is not None:
            seq.blocks = forks.follow(seq, leader, self.blocks)
        elif self.cache:
            self._look_up(seq)
        # Shared blocks are charged once, to the cache.
        own = self.blocks.blocks_for(seq.prompt_len + seq.request.max_tokens) - len(seq.blocks)
        if not self._make_room(own):
            forks.unfollow(seq)
            self.blocks.release_all(seq.blocks)
            seq.blocks, seq.hit = [], NO_HIT
            return None
        seq.blocks += self.blocks.allocate(own)
        return own

    def choose_slot(self, seq: Sequence, free: list[int]) -> tuple[int, int]:
        """(slot, tokens of its kept cells to reuse) for ``seq``, among ``free`` slots."""
        if self.resident is None:
            return free[0], 0
        # NOTE: a follower's cells are its leader's copy; prompt logprobs need every position
        # prefilled: neither reuses what a slot kept.
        reuse = seq.leader is None and not prompt_logprobs.wanted(seq)
        return self.resident.choose(seq.request.prompt_ids, free, reuse)

    def attach(self, seq: Sequence, slot: int, reused: int) -> None:
        """``seq`` just took ``slot``: let it see what it reuses; prefill starts after it."""
        if self.cache:
            self._attach_cached(seq, slot)
        elif self.resident:
            self.resident.take(slot)
            self.runtime.forget(slot, reused)
            seq.n_past = seq.timeline.prefix_tokens = reused

    def park(self, seq: Sequence, reason: str) -> None:
        """``seq`` finished in its slot: cache its prefix (never after a failure, which may
        have left its cells wrong)."""
        if self.cache and reason != FINISH_ERROR:
            self.quietly(
                seq,
                "caching a finished request's prefix",
                lambda c: c.park(seq.kv_tokens(), seq.blocks, seq.slot),
            )

    def vacate(self, seq: Sequence, keep: bool) -> None:
        """``seq``'s slot is given up: ``keep`` (with ``--kv-layout slots``) leaves its cells
        for the next grant, else they go."""
        if self.resident is not None and keep:
            self.resident.keep(seq.slot, seq.kv_tokens())
        else:
            self.runtime.forget(seq.slot)

    def release(self, seq: Sequence, had_slot: bool) -> None:
        """Give back ``seq``'s blocks; after a slot, bound the idle cached blocks in cells."""
        self.blocks.release_all(seq.blocks)
        if had_slot and self.cache:
            self.quietly(
                seq, "bounding a finished request's cached blocks in cells", lambda c: c.trim()
            )

    def stats(self) -> CacheStats | None:
        if self.cache:
            return self.cache.stats
        return self.resident.stats if self.resident else None

    def _look_up(self, seq: Sequence) -> None:
        with self.call() as cache:
            hit = cache.lookup(seq.request.prompt_ids)
        if prompt_logprobs.wanted(seq):  # cached positions have no logits: prefill them again
            self.blocks.release_all(list(hit.block_ids))
            seq.timeline.prefix_recomputed = hit.n_tokens
            return
        seq.hit, seq.blocks = hit, list(hit.block_ids)  # pinned: held like its own blocks
        seq.timeline.host_restored(hit.host_tokens, hit.restore_ns)

    def _make_room(self, n_blocks: int) -> bool:
        if self.cache:
            with self.call() as cache:
                return cache.make_room(n_blocks)
        return self.blocks.can_allocate(n_blocks)

    def _attach_cached(self, seq: Sequence, slot: int) -> None:
        """Let the slot see the cells of its hit and of the start of the block after it."""
        with self.call() as cache:
            if seq.hit.n_tokens:
                cache.attach(seq.hit, slot)
                seq.n_past = seq.hit.n_tokens
            # NOTE: a follower takes its leader's prompt cells, and a request that wants
            # prompt logprobs prefills every position: neither reuses part of a block.
            if seq.leader is None and not prompt_logprobs.wanted(seq):
                seq.n_past += cache.attach_partial(seq.hit, seq.request.prompt_ids, slot)
        seq.timeline.prefix_tokens = seq.n_past

    # -- failures of the prefix cache ----------------------------------------------------------

    def quietly(self, seq: Sequence, what: str, call: Callable[[PrefixCache], object]) -> None:
        """A cache step after ``seq`` finished. The request was served in full whatever
        happens here, so it keeps its finish; a cache failure (the cache is reset) is logged."""
        try:
            with self.call() as cache:
                call(cache)
        except RequestError as exc:
            log.warning(
                "%s failed; the request keeps its finish",
                what,
                extra=fields(request_id=seq.request_id, error=f"{exc}: {exc.__cause__!r}"),
            )

    @contextmanager
    def call(self) -> Iterator[PrefixCache]:
        """A prefix-cache operation for the request being served. If it fails, the tree, the
        cache sequences and the blocks' cached flags may disagree: rather than serve from a
        wrong cache, every cached prefix is dropped, and the failure is that request's."""
        assert self.cache is not None
        try:
            yield self.cache
        except EngineFatalError:
            raise
        except Exception as exc:
            self.reset()
            raise RequestError("prefix cache failure (the cache was reset)") from exc

    def reset(self) -> None:
        """Drop every cached prefix: cached flags, cache sequences' cells, the tree. Running
        requests keep the cells they see (tagged with their slots); waiting ones lose their
        hits, whose cells only cache sequences held."""
        cached = self.blocks.cached
        try:
            assert self.cache is not None
            self.cache.reset()
            stray = self._release_stray_references()
            hits = [s for s in self._live() if s.status is Status.WAITING and s.hit.n_tokens]
            for seq in hits:
                self._drop_hit(seq)
        except Exception as exc:
            raise EngineFatalError("the prefix cache failed and could not be reset") from exc
        log.error(
            "prefix cache reset: every cached prefix dropped",
            extra=fields(cached_blocks=cached, stray_refs=stray, waiting_hits_lost=len(hits)),
        )

    def _release_stray_references(self) -> int:
        """With nothing cached, every reference to a block is a request's: release the others
        (pins a failed cache operation took and never gave back). Returns how many."""
        held = Counter(block for seq in self._live() for block in seq.blocks)
        stray = 0
        for block in range(self.blocks.total):
            extra = self.blocks.refcount(block) - held[block]
            if extra < 0:
                raise RuntimeError(f"block {block} has fewer references than requests hold")
            for _ in range(extra):
                self.blocks.release(block)
            stray += extra
        return stray

    def _drop_hit(self, seq: Sequence) -> None:
        """A waiting request whose cached prefix is gone prefills it, on blocks of its own."""
        n = len(seq.hit.block_ids)
        self.blocks.release_all(seq.blocks[:n])
        seq.blocks, seq.hit = seq.blocks[n:], NO_HIT
        if self.blocks.can_allocate(n):
            seq.blocks = self.blocks.allocate(n) + seq.blocks
        else:
            self._fail(seq, "its cached prefix was dropped and no KV space is left")
