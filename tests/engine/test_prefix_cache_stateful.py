"""The prefix cache under any interleaving of requests, steps, finishes and cancels.

Hypothesis drives the real ``EngineCore`` with the real ``KvSpace``, ``HostCache``, block
accountant, radix tree and ``kv_state`` over a model-free runtime that keeps llama.cpp's KV
cells a stream per slot and writes saved states in llama.cpp's layout (``fake_runtime.py``):
a request handed a wrong or missing cell generates something else than the same request run
alone would.
"""

from __future__ import annotations

import struct
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

from tests.engine.fake_runtime import EOG, FakeRuntime, reference_output
from tests.engine.test_speculation import FreeRows
from tinyserve import protocol as p
from tinyserve.config import build_config
from tinyserve.engine.core import EngineCore
from tinyserve.engine.kv.host_cache import TIER_HOST, TIER_SLOT, HostCache
from tinyserve.engine.request.sequence import SequenceStatus

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
    """An ``EngineCore`` on a ``FakeRuntime``: submits, ticks and cancels, and checks after
    each tick that the slots' cells, what they keep, the cache's tree, accountant and arena
    agree, and that every finished request generated what it would have alone."""

    def __init__(self, slots: int, ctx_blocks: int, max_queue: int, host_bytes: int) -> None:
        config = build_config(
            {
                "ctx_per_slot": ctx_blocks * BLOCK,
                "slots": slots,
                "chunk": 6,
                "max_batch_tokens": 12,
                "block_size": BLOCK,
                "max_queue": max_queue,
                "host_cache_mb": 1 if host_bytes else 0,
                "threads": 1,
            },
            environ={},
        )
        self.runtime = FakeRuntime(ctx_blocks * BLOCK, slots, config.max_batch_tokens)
        self.core = EngineCore(config, self.runtime, clock=lambda: 0)
        # every guess pays, whatever the machine's timings: the same examples, the same steps
        self.core.scheduler.guessing.step_cost = FreeRows()
        kv = self.core.kv
        if host_bytes:  # a bound of a few fake blocks (each 96 bytes), not 1 MB
            assert kv.cache is not None
            kv._capacity = host_bytes
            kv.cache = HostCache(kv.cache.layout, BLOCK, host_bytes, kv.stats)
        self.requests: dict[str, p.Submit] = {}
        self.outputs: dict[str, list[int]] = defaultdict(list)
        self.finishes: dict[str, p.RequestUpdate] = {}
        self.queue_was_full: set[str] = set()  # may be rejected queue_full only if in here
        self.history: list[list[int]] = []  # prompts, and prompts + outputs, to extend

    def submit(self, prompt: list[int], max_tokens: int, seed: int, ignore_eos: bool) -> str:
        sampling = p.SamplingParams(temperature=1.0, seed=seed, ignore_eos=ignore_eos)
        request = p.Submit(f"r{len(self.requests)}", FRONTEND, prompt, sampling, max_tokens)
        self.requests[request.request_id] = request
        self.history.append(prompt)
        scheduler = self.core.scheduler
        free = scheduler.slots.count(None)
        if len(scheduler.policy) - free >= scheduler.config.max_queue:
            self.queue_was_full.add(request.request_id)
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

    def _finished(self, update: p.RequestUpdate) -> None:
        rid = update.request_id
        self.finishes[rid] = update
        request, output = self.requests[rid], self.outputs[rid]
        assert update.finish_reason != p.FINISH_ERROR, (rid, update.detail, self.runtime.errors)
        if update.finish_reason == p.FINISH_REJECTED:
            too_long = len(request.prompt_ids) + request.max_tokens > self.runtime.n_ctx_seq
            assert rid in self.queue_was_full or too_long, (rid, update.detail)
            return
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
        self.check_slots()
        self.check_cache()

    def check_slots(self) -> None:
        """A running request's slot holds its own tokens at positions < n_past and nothing
        else; a free slot holds exactly what it says it keeps."""
        kept = self.core.kv.kept.tokens
        for slot, seq in enumerate(self.core.slots()):
            cells = self.runtime.streams[slot]
            if seq is None:
                assert cells == dict(enumerate(kept[slot])), f"free slot {slot}"
            else:
                assert seq.status in (SequenceStatus.PREFILL, SequenceStatus.DECODE)
                assert cells == dict(enumerate(seq.kv_tokens())), f"slot {slot}"

    def check_cache(self) -> None:
        """Rows are cached exactly while the tree holds them, none stays pinned between ticks,
        and each row's KV is its own block's: positions and tokens of its path."""
        cache = self.core.kv.cache
        if cache is None:
            return
        blocks, tree = cache.blocks, cache.tree
        assert blocks.free + blocks.used + blocks.cached == blocks.total
        assert blocks.used == 0
        assert [b for b in range(blocks.total) if blocks.is_cached(b)] == [
            b for b in range(blocks.total) if b in tree
        ]
        assert cache.stats.blocks_held == tree.n_nodes
        for row in cache.held():
            path = tree.path_tokens(row)
            start = tree.depth(row) * BLOCK  # a tail's row holds fewer cells than a block's
            k_rows = cache.arena[row, 12 * BLOCK : 20 * BLOCK].tobytes()
            cells = [struct.unpack_from("<ii", k_rows, 8 * i) for i in range(len(path) - start)]
            assert cells == [(start + i, t) for i, t in enumerate(path[start:])], row


# -- worked examples ---------------------------------------------------------------------------


def test_same_prompt_twice_then_an_extension() -> None:
    """Issue 11's sequence: the same prompt twice at once, then an extension of it, which
    reuses the prompt's block (from the slot that kept it)."""
    engine = CachedEngine(slots=2, ctx_blocks=24, max_queue=6, host_bytes=10**4)
    prompt = [1, 2, 3, 1, 2, 3]  # one full block before the last token
    engine.submit(prompt, 8, seed=1, ignore_eos=True)
    engine.submit(prompt, 3, seed=2, ignore_eos=True)
    engine.run_to_idle()
    extended = engine.submit([*prompt, 3, 3], 2, seed=3, ignore_eos=True)
    engine.run_to_idle()
    assert engine.finishes[extended].cached_tokens >= len(prompt) - 1
    engine.runtime.close()


def test_a_prefix_no_slot_kept_comes_back_from_host_memory() -> None:
    """A prompt's cells overwritten in its slot by others' come back from the cache: the next
    turn reuses them (and generates what it would alone: ``_finished`` checks)."""
    engine = CachedEngine(slots=1, ctx_blocks=8, max_queue=6, host_bytes=10**4)
    first = [1, 2, 3, 1, 2, 3, 1, 2, 3]  # two full blocks before the last token
    engine.submit(first, 3, seed=1, ignore_eos=True)
    engine.run_to_idle()
    engine.submit([3, 3, 2] * 3, 4, seed=2, ignore_eos=True)  # the one slot's cells go
    engine.run_to_idle()
    assert engine.core.kv.kept.tokens[0][:2] == [3, 3]
    again = engine.submit([*first, 3, 3], 2, seed=3, ignore_eos=True)
    engine.run_to_idle()
    assert engine.finishes[again].cached_tokens >= 2 * BLOCK
    assert engine.core.kv.stats.hit_tokens[TIER_HOST] >= 2 * BLOCK
    engine.runtime.close()


def test_a_conversation_that_comes_back_to_its_slot_moves_nothing() -> None:
    engine = CachedEngine(slots=2, ctx_blocks=16, max_queue=6, host_bytes=10**4)
    first = [1, 2, 3, 1, 2, 3, 1, 2, 3]
    rid = engine.submit(first, 4, seed=1, ignore_eos=True)
    engine.run_to_idle()
    turn = [*first, *engine.outputs[rid], 2, 2]
    again = engine.submit(turn, 2, seed=3, ignore_eos=True)
    engine.run_to_idle()
    stats = engine.core.kv.stats
    assert stats.hit_tokens[TIER_SLOT] == engine.finishes[again].cached_tokens > len(first)
    assert stats.restored_tokens == 0
    engine.runtime.close()


# -- any interleaving --------------------------------------------------------------------------


class PrefixCacheMachine(RuleBasedStateMachine):
    """Random submits, ticks and cancels over a ``CachedEngine``, which checks everything
    after every tick."""

    max_queue = 6
    host_bytes = 0

    @initialize(slots=st.integers(1, 3), ctx_blocks=st.sampled_from([8, 12, 24, 48]))
    def start(self, slots: int, ctx_blocks: int) -> None:
        self.engine = CachedEngine(slots, ctx_blocks, self.max_queue, self.host_bytes)

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
        live = sorted(self.engine.core.scheduler.by_id)
        self.engine.core.cancel(live[pick % len(live)])

    @rule()
    def run_to_idle(self) -> None:
        self.engine.run_to_idle()

    @invariant()
    def consistent(self) -> None:
        self.engine.check()


# No shared cache (slots keep their own only); a bound of ~10 fake blocks, so that stores
# evict; and one that keeps everything.
@pytest.mark.parametrize(("max_queue", "host_bytes"), [(6, 0), (6, 1000), (24, 10**6)])
def test_prefix_cache_under_any_interleaving(max_queue: int, host_bytes: int) -> None:
    limits = {"max_queue": max_queue, "host_bytes": host_bytes}
    machine = type(f"Machine{max_queue}_{host_bytes}", (PrefixCacheMachine,), limits)
    run_state_machine_as_test(machine, settings=SETTINGS)
