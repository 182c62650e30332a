"""The prefix cache under any interleaving of requests, steps, finishes and cancels.

Hypothesis drives the real ``EngineCore`` with the real ``PrefixCache``, ``BlockAccountant`` and
radix tree over a model-free runtime that keeps llama.cpp's unified KV cells
(``fake_runtime.py``): a request handed a wrong or missing cell generates something else than
the same request run alone would.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from tests.engine.fake_runtime import EOG, FakeRuntime, as_view, reference_output
from tinyserve import protocol as p
from tinyserve.config import build_config
from tinyserve.engine.core import EngineCore
from tinyserve.engine.prefix_cache import PrefixCache
from tinyserve.engine.sequence import Sequence, Status

BLOCK = 4
FRONTEND = "f" * 32
TOKENS = st.integers(1, 3)
SETTINGS = settings(
    max_examples=100,
    stateful_step_count=50,
    derandomize=True,
    database=None,
    deadline=None,
    report_multiple_bugs=False,
    suppress_health_check=[HealthCheck.too_slow],
)


class CachedEngine:
    """An ``EngineCore`` on a ``FakeRuntime`` with the prefix cache: submits, ticks and
    cancels, and checks after each tick that the accounting, the radix tree and the KV cells
    agree and that every finished request generated what it would have alone."""

    def __init__(
        self, cache_seqs: int, slots: int, ctx_blocks: int, max_queue: int, host_bytes: int = 0
    ) -> None:
        config = build_config(
            {
                "ctx": ctx_blocks * BLOCK,
                "slots": slots,
                "chunk": 6,
                "max_batch_tokens": 12,
                "block_size": BLOCK,
                "max_queue": max_queue,
                "cache_seqs": cache_seqs,
                "host_cache_mb": 1 if host_bytes else 0,
                "threads": 1,
            },
            environ={},
        )
        self.runtime = FakeRuntime(config.ctx, config.n_seq_max, config.max_batch_tokens)
        self.core = EngineCore(config, self.runtime, clock=lambda: 0)
        if host_bytes:  # a bound of a few fake blocks (each ~300 bytes), not 1 MB
            assert self.cache.host is not None
            self.cache.host.capacity = host_bytes
        self.cache_seq_ids = range(slots, slots + cache_seqs)
        self.requests: dict[str, p.Submit] = {}
        self.outputs: dict[str, list[int]] = defaultdict(list)
        self.finishes: dict[str, p.RequestUpdate] = {}
        # May be rejected for room only if in here: short of blocks (or behind others who are)
        # when the queue was full.
        self.could_not_fit: set[str] = set()
        self.history: list[list[int]] = []  # prompts, and prompts + outputs, to extend

    @property
    def cache(self) -> PrefixCache:
        assert self.core.cache is not None
        return self.core.cache

    def submit(self, prompt: list[int], max_tokens: int, seed: int, ignore_eos: bool) -> str:
        sampling = p.SamplingParams(temperature=1.0, seed=seed, ignore_eos=ignore_eos)
        request = p.Submit(f"r{len(self.requests)}", FRONTEND, prompt, sampling, max_tokens)
        self.requests[request.request_id] = request
        self.history.append(prompt)
        need = self.core.blocks.blocks_for(len(prompt) + max_tokens)
        if self.core.blocked or self.core.blocks.available < need:
            self.could_not_fit.add(request.request_id)
        self.core.submit(request)
        return request.request_id

    def tick(self) -> None:
        for updates in self.core.step().updates.values():
            for update in updates:
                self.outputs[update.request_id] += update.token_ids
                if update.finish_reason is not None:
                    self._finished(update)
        self.check()

    def run_to_idle(self) -> None:
        for _ in range(400):
            busy = self.core.has_work()
            self.tick()  # once more when idle: it publishes what the last finish left
            if not busy:
                break
        assert not self.core.has_work(), "requests did not finish"
        assert self.core.blocks.used == 0
        assert self.core.blocks.cached == self.cache.tree.n_nodes

    def _finished(self, update: p.RequestUpdate) -> None:
        rid = update.request_id
        self.finishes[rid] = update
        request, output = self.requests[rid], self.outputs[rid]
        assert update.finish_reason != p.FINISH_ERROR, (rid, update.detail, self.runtime.errors)
        if update.detail == p.REJECT_KV_CACHE_FULL:
            assert rid in self.could_not_fit, f"{rid} rejected for room while the room was there"
        expected, _ = reference_output(request, len(output))
        assert output == expected, f"{rid} generated {output}, alone it would be {expected}"
        if update.finish_reason == p.FINISH_STOP:  # the end-of-generation token is reported
            assert output[-1] == EOG and EOG not in output[:-1]
            output = output[:-1]
        if update.finish_reason == p.FINISH_LENGTH:
            assert len(output) == request.max_tokens
        if output:
            self.history.append(list(request.prompt_ids) + output)

    # -- invariants --------------------------------------------------------------------------

    def check(self) -> None:
        assert not self.runtime.errors, self.runtime.errors
        self.check_accounting()
        self.check_tree()
        self.check_cache_seqs()
        self.check_requests()
        self.check_host()

    def check_accounting(self) -> None:
        """Refcounts are the live requests holding a block; cached blocks are the tree's."""
        blocks, live = self.core.blocks, list(self.core.by_id.values())
        assert blocks.free + blocks.used + blocks.cached == blocks.total
        holders = [b for seq in live for b in seq.blocks]
        for block in range(blocks.total):
            assert blocks.refcount(block) == holders.count(block), f"block {block}"
        assert blocks.used == len(set(holders))
        in_tree = [b for b in range(blocks.total) if b in self.cache.tree]
        assert [b for b in range(blocks.total) if blocks.is_cached(b)] == in_tree
        assert blocks.cached == len([b for b in in_tree if blocks.refcount(b) == 0])
        cells = len(self.runtime.kv.cells)
        assert cells <= (blocks.used + blocks.cached) * BLOCK, f"{cells} cells, {blocks}"

    def check_tree(self) -> None:
        """Each cached block's owner sees exactly the block's tokens at its positions."""
        tree, kv = self.cache.tree, self.runtime.kv
        for block in range(self.core.blocks.total):
            if block in tree:
                path, owner = tree.path_tokens(block), tree.owner(block)
                start = len(path) - BLOCK
                seen = {pos: t for pos, t in kv.view(owner).items() if start <= pos < len(path)}
                assert seen == as_view(path[start:], start), f"block {block} of seq {owner}"

    def check_cache_seqs(self) -> None:
        """A cache sequence sees the cells of the blocks it owns and nothing else; a spare one
        sees nothing."""
        cache, kv = self.cache, self.runtime.kv
        in_use = cache.tree.seqs_in_use()
        assert not in_use & set(cache.spare_seqs)
        assert sorted(in_use | set(cache.spare_seqs)) == list(self.cache_seq_ids)
        owned: dict[int, set[int]] = defaultdict(set)
        for block in range(self.core.blocks.total):
            if block in cache.tree:
                end = len(cache.tree.path_tokens(block))
                owned[cache.tree.owner(block)] |= set(range(end - BLOCK, end))
        for seq in self.cache_seq_ids:
            assert set(kv.view(seq)) == owned[seq], f"cache seq {seq}"

    def check_host(self) -> None:
        """The host tier is within its bound, each of its blocks holds its own tokens at its
        own positions, and the scratch sequence is left with no cells."""
        host = self.cache.host
        if host is None:
            return
        assert self.runtime.kv.view(self.cache.scratch) == {}
        assert host.bytes == sum(b.size for b in host.blocks()) <= host.capacity
        for block in host.blocks():
            start = block.depth * BLOCK
            cells = dict(json.loads(block.kv))
            assert cells == {start + i: t for i, t in enumerate(block.tokens)}, block

    def check_requests(self) -> None:
        """A running request's slot sees its own tokens at positions < n_past (handed over by
        a hit or computed) and nothing else; a free slot sees nothing; a hit is pinned."""
        for slot, seq in enumerate(self.core.slots):
            seen = self.runtime.kv.view(slot)
            if seq is None:
                assert not seen, f"free slot {slot} sees {seen}"
            else:
                assert seq.status in (Status.PREFILL, Status.DECODE)
                assert seen == as_view(seq.kv_tokens()), f"slot {slot} of {seq.request_id}"
        for seq in self.core.by_id.values():
            self._check_hit(seq)

    def _check_hit(self, seq: Sequence) -> None:
        block_ids = seq.hit.block_ids
        assert seq.blocks[: len(block_ids)] == block_ids
        if block_ids:
            tree = self.cache.tree
            assert tree.path_tokens(block_ids[-1]) == seq.request.prompt_ids[: seq.hit.n_tokens]


# -- worked examples ---------------------------------------------------------------------------


def whole_blocks_reused(engine: CachedEngine, rid: str, partial_before: int) -> int:
    """The cached tokens of ``rid`` that its hit's whole blocks gave (``rid`` the only
    request since the cache counted ``partial_before``); the rest came from the start of a
    cached block at its slot grant."""
    partial = engine.cache.stats.partial_tokens - partial_before
    return engine.finishes[rid].cached_tokens - partial


def test_same_prompt_twice_then_an_extension_with_one_cache_seq() -> None:
    """Issue 11's report: parking the second copy needed the only cache sequence, whose
    eviction took the shared block the copy had counted as known; the tree then named the
    copy's own block there (freed next), and the extension's hit acquired a free block."""
    engine = CachedEngine(cache_seqs=1, slots=2, ctx_blocks=24, max_queue=6)
    prompt = [1, 2, 3, 1, 2, 3]  # one full block before the last token
    engine.submit(prompt, 8, seed=1, ignore_eos=True)
    engine.submit(prompt, 3, seed=2, ignore_eos=True)
    engine.run_to_idle()
    partial_before = engine.cache.stats.partial_tokens
    extended = engine.submit([*prompt, 3, 3], 2, seed=3, ignore_eos=True)
    engine.run_to_idle()
    assert whole_blocks_reused(engine, extended, partial_before) == BLOCK
    engine.runtime.close()


def test_every_cache_seq_pinned_when_a_copy_parks() -> None:
    """The same with 16 cache sequences: each holds a prefix that a waiting request pinned,
    so parking the copy evicts down the known prefix's own sequence."""
    engine = CachedEngine(cache_seqs=16, slots=1, ctx_blocks=64, max_queue=24)
    branches = [[a, b, c, 1] for a in (1, 2, 3) for b in (1, 2, 3) for c in (1, 2)][:15]
    for branch in branches:
        engine.submit([*branch, 1], 1, seed=0, ignore_eos=True)  # parks one block
    engine.run_to_idle()
    prompt = [3, 3, 3, 3, 3, 3]
    engine.submit(prompt, 8, seed=1, ignore_eos=True)
    engine.submit(prompt, 3, seed=2, ignore_eos=True)
    for branch in branches:
        engine.submit([*branch, 2, 2], 1, seed=0, ignore_eos=True)  # a hit, waiting
    engine.run_to_idle()
    assert len(engine.cache.tree.seqs_in_use()) == 16
    partial_before = engine.cache.stats.partial_tokens
    extended = engine.submit([*prompt, 3, 3], 2, seed=3, ignore_eos=True)
    engine.run_to_idle()
    assert whole_blocks_reused(engine, extended, partial_before) == BLOCK
    engine.runtime.close()


def test_an_evicted_prefix_comes_back_from_host_memory() -> None:
    """A prompt's blocks evicted by others' come back from the host tier: the next turn
    reuses them (and generates what it would alone: ``_finished`` checks), and the host tier
    kept within its bound all along."""
    engine = CachedEngine(cache_seqs=2, slots=1, ctx_blocks=8, max_queue=6, host_bytes=10**6)
    first = [1, 2, 3, 1, 2, 3, 1, 2, 3]  # two full blocks before the last token
    engine.submit(first, 3, seed=1, ignore_eos=True)
    engine.run_to_idle()
    for other in ([3, 3, 2] * 3, [2, 1, 3] * 3, [3, 1, 1] * 3, [1, 1, 2] * 3):
        engine.submit(other, 4, seed=2, ignore_eos=True)  # fills the cells: evicts the first
        engine.run_to_idle()
    assert engine.cache.tree.match(first[:8]).n_tokens == 0, "the first prompt was not evicted"
    assert engine.cache.stats.host_saved_blocks > 0
    again = engine.submit([*first, 3, 3], 2, seed=3, ignore_eos=True)
    engine.run_to_idle()
    assert engine.finishes[again].cached_tokens == 2 * BLOCK
    assert engine.cache.stats.host_hit_tokens == 2 * BLOCK
    engine.runtime.close()


# -- any interleaving --------------------------------------------------------------------------


class PrefixCacheMachine(RuleBasedStateMachine):
    """Random submits, ticks and cancels over a ``CachedEngine``, which checks everything
    after every tick."""

    cache_seqs = 16
    max_queue = 6
    host_bytes = 0

    @initialize(slots=st.integers(1, 3), ctx_blocks=st.sampled_from([8, 12, 24, 48]))
    def start(self, slots: int, ctx_blocks: int) -> None:
        self.engine = CachedEngine(
            self.cache_seqs, slots, ctx_blocks, self.max_queue, self.host_bytes
        )

    def teardown(self) -> None:
        if hasattr(self, "engine"):
            try:
                self.engine.run_to_idle()  # every request accepted finishes as it should
            finally:
                self.engine.runtime.close()

    @rule(
        pick=st.integers(0, 1000),
        keep=st.integers(0, 40),
        suffix=st.lists(TOKENS, max_size=9),
        max_tokens=st.lists(st.integers(1, 12), min_size=1, max_size=3),
        seed=st.integers(0, 1000),
        ignore_eos=st.booleans(),
    )
    def submit(
        self,
        pick: int,
        keep: int,
        suffix: list[int],
        max_tokens: list[int],
        seed: int,
        ignore_eos: bool,
    ) -> None:
        """One prompt (fresh, or cut from / extending an earlier prompt or prompt + output),
        submitted once per ``max_tokens`` entry, each with its own seed: identical prompts at
        once when there are several."""
        prompt = self._earlier(pick, keep) + suffix or [1]
        for i, limit in enumerate(max_tokens):
            self.engine.submit(prompt, limit, seed + i, ignore_eos)

    @rule(
        pick=st.integers(0, 1000),
        keep=st.integers(0, 40),
        tails=st.lists(st.lists(TOKENS, min_size=1, max_size=8), min_size=2, max_size=8),
        max_tokens=st.integers(1, 6),
        seed=st.integers(0, 1000),
    )
    def submit_branches(
        self, pick: int, keep: int, tails: list[list[int]], max_tokens: int, seed: int
    ) -> None:
        """Prompts that share a prefix and then diverge, at once: each parks a branch."""
        base = self._earlier(pick, keep)
        for i, tail in enumerate(tails):
            self.engine.submit(base + tail, max_tokens, seed + i, True)

    @rule(picks=st.lists(st.integers(0, 1000), min_size=2, max_size=8), extra=TOKENS)
    def resubmit_earlier(self, picks: list[int], extra: int) -> None:
        """Earlier prompts or prompts + outputs, one token longer, at once: many hits."""
        for i, pick in enumerate(picks):
            self.engine.submit([*self._earlier(pick, sys.maxsize), extra], 2, i, False)

    def _earlier(self, pick: int, keep: int) -> list[int]:
        history = self.engine.history
        return history[pick % len(history)][:keep] if history else []

    @rule(ticks=st.integers(1, 12))
    def step(self, ticks: int) -> None:
        for _ in range(ticks):
            self.engine.tick()

    @precondition(lambda self: hasattr(self, "engine") and self.engine.core.has_work())
    @rule(pick=st.integers(0, 100))
    def cancel(self, pick: int) -> None:
        """A waiting or running request, ended now."""
        live = sorted(self.engine.core.by_id)
        self.engine.core.cancel(live[pick % len(live)])

    @rule()
    def run_to_idle(self) -> None:
        self.engine.run_to_idle()

    @invariant()
    def consistent(self) -> None:
        self.engine.check()


# With 16 cache sequences, every one is in use and pinned only with many requests waiting.
# With a host tier: a bound of ~5 fake blocks (evictions push blocks out of it too), and one
# that keeps everything (every evicted block can come back).
@pytest.mark.parametrize(
    ("cache_seqs", "max_queue", "host_bytes"),
    [(1, 6, 0), (2, 6, 0), (16, 24, 0), (2, 6, 1500), (16, 24, 10**7)],
)
def test_prefix_cache_under_any_interleaving(
    cache_seqs: int, max_queue: int, host_bytes: int
) -> None:
    limits = {"cache_seqs": cache_seqs, "max_queue": max_queue, "host_bytes": host_bytes}
    machine = type(f"Machine{cache_seqs}_{host_bytes}", (PrefixCacheMachine,), limits)
    run_state_machine_as_test(machine, settings=SETTINGS)
