"""The prefix cache with the real model: what it hands over, what it keeps, what it evicts."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tinyserve import protocol as p
from tinyserve.engine.core import EngineCore
from tinyserve.engine.host_cache import ROOT, HostBlock, HostCache, chain_keys
from tinyserve.engine.prefix_cache import MISS_EVICTED, MISS_NO_MATCH, MISS_SHORT
from tinyserve.engine.runtime import LlamaRuntime

from .conftest import core_config
from .test_core import Driver
from .test_prompt_logprobs import submit as submit_scored

Tokenize = Callable[[str], list[int]]

SYSTEM = (
    "<|im_start|>system\n"
    + "You are a helpful assistant who answers questions about geography, history and "
    "science with short precise facts. Always be concise and cite well known sources. "
    * 3
    + "<|im_end|>\n"
)


def chat(question: str) -> str:
    return f"{SYSTEM}<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"


# Measured by bench/chunking_noise.py on this prompt (105 tokens): chunks of 7-48 tokens moved
# the top-5 first-token logprobs by up to 0.244 nats (and swapped two near-tied tokens); a
# 96-token cache hit matched a one-piece prefill exactly; the same tokens' blocks shifted by one
# position moved them by 1.129 nats. 0.6 sits between chunking noise and a wrong reuse.
TOLERANCE = 0.6


def first_logprobs(d: Driver, rid: str) -> dict[int, float]:
    entries = [e for u in d.updates[rid] for e in u.logprobs]
    return {token: lp for token, lp in entries[0][1]}


def same_prediction(a: dict[int, float], b: dict[int, float]) -> bool:
    top_a, top_b = list(a)[:5], list(b)[:5]
    return top_a == top_b and max(abs(a[t] - b[t]) for t in top_a) < TOLERANCE


def hand_over_instead(d: Driver, cached: list[int]) -> None:
    """Sabotage ``d``'s cache: every lookup is answered with the blocks of ``cached``
    (already run) instead of the prompt's own, as a wrong reuse would."""
    tree = d.core.cache.tree  # type: ignore[union-attr]

    class Wrong:
        def __getattr__(self, name: str) -> Any:
            return getattr(tree, name)

        def match(self, tokens: list[int]) -> Any:
            return tree.match(cached[: len(tokens)])

    d.core.cache.tree = Wrong()  # type: ignore[union-attr,assignment]


def run(d: Driver, prompt: list[int], **kw: Any) -> str:
    rid = d.submit(prompt, **{"max_tokens": 2, **kw})
    d.run()
    return rid


@pytest.fixture(scope="module")
def reference(runtime: LlamaRuntime, tokenize: Tokenize) -> dict[int, float]:
    """First-token logprobs of the question with no cache, prefilled in one piece."""
    d = Driver(
        EngineCore(core_config(prefix_cache=False, chunk=256, max_batch_tokens=256), runtime)
    )
    return first_logprobs(d, run(d, tokenize(chat("Name three rivers in Europe.")), logprobs=20))


def cached_driver(runtime: LlamaRuntime, **overrides: Any) -> Driver:
    return Driver(EngineCore(core_config(chunk=256, max_batch_tokens=256, **overrides), runtime))


def test_shared_prefix_hands_over_the_same_prediction(
    runtime: LlamaRuntime, tokenize: Tokenize, reference: dict[int, float]
) -> None:
    d = cached_driver(runtime)
    earlier, question = (
        tokenize(chat("What is the capital of France?")),
        tokenize(chat("Name three rivers in Europe.")),
    )
    run(d, earlier)
    rid = run(d, question, logprobs=20)
    final = d.final(rid)
    shared = next(i for i, (a, b) in enumerate(zip(earlier, question, strict=False)) if a != b)
    assert shared % 16  # the shared part ends inside a block: the test covers both kinds
    # Every full block of the shared part, then the start of the block it ends in.
    assert final.cached_tokens == shared
    assert d.core.cache.stats.partial_tokens == shared % 16  # type: ignore[union-attr]
    assert d.finishes[rid].timeline.prefix_tokens == final.cached_tokens
    assert same_prediction(reference, first_logprobs(d, rid))


# Shorter than a block, sharing their first words.
DRAGON = "Write a short story about a dragon. Once upon a time,"
ROBOT = "Write a short story about a robot. Once upon a time,"


def test_a_short_prompt_reuses_the_start_of_a_cached_block(
    runtime: LlamaRuntime, tokenize: Tokenize
) -> None:
    # Two prompts shorter than a block that share their first words: no whole block to find,
    # part of one to reuse (llama-server's slots reuse a common start this way too).
    first, second = tokenize(DRAGON), tokenize(ROBOT)
    shared = next(i for i, (a, b) in enumerate(zip(first, second, strict=True)) if a != b)
    assert 0 < shared < len(second) < 16
    cold = Driver(EngineCore(core_config(prefix_cache=False), runtime))
    expected = first_logprobs(cold, run(cold, second, logprobs=20))
    d = cached_driver(runtime)
    run(d, first, max_tokens=8)  # its first block (prompt and replies) is cached
    rid = run(d, second, logprobs=20)
    assert d.final(rid).cached_tokens == shared
    assert same_prediction(expected, first_logprobs(d, rid))
    assert_idle(d)


def test_partial_reuse_survives_the_block_being_evicted(
    runtime: LlamaRuntime, tokenize: Tokenize
) -> None:
    # The reused cells stay the slot's when the cached block they came from goes.
    first, second = tokenize(DRAGON), tokenize(ROBOT)
    cold = Driver(EngineCore(core_config(prefix_cache=False), runtime))
    expected = cold.tokens(run(cold, second, max_tokens=12))
    d = cached_driver(runtime)
    run(d, first, max_tokens=8)
    rid = d.submit(second, max_tokens=12)
    d.step()  # granted and prefilled: the cells are shared now
    assert d.core.by_id[rid].timeline.prefix_tokens > 0
    cache = d.core.cache
    assert cache is not None
    assert cache.make_room(d.core.blocks.available)  # every cached block goes
    assert cache.tree.n_nodes == 0
    d.run()
    assert d.tokens(rid) == expected
    assert_idle(d)


def test_no_partial_reuse_for_prompt_logprobs(runtime: LlamaRuntime, tokenize: Tokenize) -> None:
    # Its prompt's every position needs logits: it prefills them all.
    d = cached_driver(runtime)
    run(d, tokenize(DRAGON), max_tokens=8)
    submit_scored(d, "scored", tokenize("Write a short story about a robot."), 2, 1)
    d.run()
    assert d.final("scored").cached_tokens == 0
    assert d.core.cache.stats.partial_tokens == 0  # type: ignore[union-attr]


def test_a_wrong_reuse_fails_the_same_check(
    runtime: LlamaRuntime, tokenize: Tokenize, reference: dict[int, float]
) -> None:
    d = cached_driver(runtime)
    question = tokenize(chat("Name three rivers in Europe."))
    shifted = question[:1] + tokenize("Note:")[1:2] + question[1:]  # one position off
    run(d, shifted)
    hand_over_instead(d, shifted)
    rid = run(d, question, logprobs=20)
    assert d.final(rid).cached_tokens >= 64
    assert not same_prediction(reference, first_logprobs(d, rid))


def test_second_turn_reuses_every_full_block_of_the_first(
    runtime: LlamaRuntime, tokenize: Tokenize
) -> None:
    d = cached_driver(runtime)
    turn1 = tokenize(chat("Tell me about Paris."))
    first = run(d, turn1, max_tokens=40)
    reply = d.tokens(first)
    in_kv = len(turn1) + len(reply) - (d.final(first).finish_reason == p.FINISH_LENGTH)
    turn2 = turn1 + reply + tokenize("<|im_end|>\n<|im_start|>user\nAnd Rome?<|im_end|>\n")[1:]
    second = run(d, turn2)
    assert d.final(second).cached_tokens == in_kv // 16 * 16
    # The second turn's new blocks extend the first turn's cached sequence: one id for both.
    assert len(d.core.cache.tree.seqs_in_use()) == 1  # type: ignore[union-attr]


def test_kv_pressure_evicts_old_prefixes_and_still_serves(
    runtime: LlamaRuntime, tokenize: Tokenize
) -> None:
    d = cached_driver(runtime, cache_cells=0)  # no bound: only pressure evicts
    total = d.core.blocks.total
    for i in range(8):
        run(d, tokenize(f"Topic {i}: " + "the quick brown fox jumps over the lazy dog " * 10))
    assert d.core.blocks.cached > total // 2
    big = run(d, tokenize("Count: 1, 2, 3,"), max_tokens=total * 16 - 40, stop=[" 6"])
    assert d.final(big).finish_reason in {p.FINISH_LENGTH, p.FINISH_STOP}
    assert d.core.cache.stats.evicted_blocks > 0  # type: ignore[union-attr]
    assert_idle(d)


def test_running_out_of_spare_sequences_evicts_the_oldest(
    runtime: LlamaRuntime, tokenize: Tokenize
) -> None:
    d = cached_driver(runtime, cache_seqs=2, host_cache_mb=0)  # else it comes back from host
    prompts = [tokenize(f"Question {i}? " + "Please explain in detail. " * 6) for i in range(4)]
    for prompt in prompts:
        run(d, prompt)
    cache = d.core.cache
    assert cache is not None
    assert len(cache.tree.seqs_in_use()) <= 2
    rid = run(d, prompts[0])  # the oldest was evicted to make a sequence id free
    assert d.final(rid).finish_reason in {p.FINISH_LENGTH, p.FINISH_STOP}
    assert cache.stats.misses[MISS_EVICTED] >= 1
    assert_idle(d)


def test_miss_reasons(runtime: LlamaRuntime, tokenize: Tokenize) -> None:
    d = cached_driver(runtime)
    run(d, tokenize("Hi"))
    run(d, tokenize(chat("Something new entirely")))
    cache = d.core.cache
    assert cache is not None
    assert cache.stats.misses[MISS_SHORT] == 1
    assert cache.stats.misses[MISS_NO_MATCH] == 1
    assert cache.stats.lookup_tokens > cache.stats.hit_tokens == 0


def test_cancelled_and_concurrent_requests_leave_accounting_idle(
    runtime: LlamaRuntime, tokenize: Tokenize
) -> None:
    d = cached_driver(runtime)
    rids = [d.submit(tokenize(chat(f"Question {i}")), max_tokens=20) for i in range(6)]
    d.step()
    d.core.cancel(rids[0])
    d.run()
    assert {d.final(r).finish_reason for r in rids[1:]} <= {p.FINISH_LENGTH, p.FINISH_STOP}
    assert_idle(d)


@pytest.mark.parametrize("host_cache_mb", [0, 16])
def test_cache_cells_bounds_the_idle_blocks_left_in_cells(
    runtime: LlamaRuntime, tokenize: Tokenize, host_cache_mb: int
) -> None:
    """``--cache-cells``: after each finish at most that many cells' worth of unreferenced
    blocks stay in llama.cpp; the least recently used go (to host memory, when there is a
    tier, from which a later request still gets them)."""
    d = cached_driver(runtime, cache_cells=48, host_cache_mb=host_cache_mb)
    cache = d.core.cache
    assert cache is not None and cache.max_cached == 3
    prompts = [tokenize(chat(f"Question number {i}?")) for i in range(3)]
    for prompt in prompts:
        run(d, prompt, max_tokens=8)
        assert d.core.blocks.cached <= 3
        assert_idle(d)
    assert cache.stats.evicted_blocks > 0
    again = run(d, prompts[0], max_tokens=8)
    hit = d.final(again).cached_tokens
    assert (hit > 48) == bool(host_cache_mb)  # the whole system prompt comes back from host
    assert d.core.blocks.cached <= 3
    assert_idle(d)


def test_cache_cells_zero_keeps_every_block(runtime: LlamaRuntime, tokenize: Tokenize) -> None:
    d = cached_driver(runtime, cache_cells=0)
    for i in range(3):
        run(d, tokenize(chat(f"Question number {i}?")), max_tokens=8)
    assert d.core.cache is not None and d.core.cache.stats.evicted_blocks == 0
    assert d.core.blocks.cached > 3  # what cache_cells=48 holds to in the test above


def assert_idle(d: Driver) -> None:
    blocks = d.core.blocks
    assert not d.core.by_id and not d.core.running
    assert blocks.used == 0
    assert blocks.cached + blocks.free == blocks.total
    assert d.core.cache is not None
    assert blocks.cached == d.core.cache.tree.n_nodes


# -- the host-memory tier ----------------------------------------------------------------------


def evict_everything(d: Driver) -> None:
    cache = d.core.cache
    assert cache is not None and cache.host is not None
    assert cache.make_room(d.core.blocks.total)
    assert cache.tree.n_nodes == 0 and d.core.blocks.cached == 0


def test_a_prefix_evicted_to_host_memory_hands_over_the_same_prediction(
    runtime: LlamaRuntime, tokenize: Tokenize, reference: dict[int, float]
) -> None:
    """Blocks evicted from the cells come back from host memory, with the prediction of a
    cold one-piece prefill (same split after the cached blocks, as the in-cells test)."""
    d = cached_driver(runtime)
    earlier, question = (
        tokenize(chat("What is the capital of France?")),
        tokenize(chat("Name three rivers in Europe.")),
    )
    run(d, earlier)
    evict_everything(d)
    rid = run(d, question, logprobs=20)
    shared = next(i for i, (a, b) in enumerate(zip(earlier, question, strict=False)) if a != b)
    assert d.final(rid).cached_tokens == shared // 16 * 16 > 0
    timeline = d.finishes[rid].timeline
    assert timeline.host_restore is not None
    assert timeline.host_restore["tokens"] == shared // 16 * 16
    assert same_prediction(reference, first_logprobs(d, rid))
    assert_idle(d)


def test_wrong_kv_from_host_memory_fails_the_same_check(
    runtime: LlamaRuntime, tokenize: Tokenize, reference: dict[int, float]
) -> None:
    """The check above can fail through the host tier: the shifted prompt's KV filed under
    the question's keys (what a key that ignored positions or tokens would do) is caught."""
    d = cached_driver(runtime)
    question = tokenize(chat("Name three rivers in Europe."))
    shifted = question[:1] + tokenize("Note:")[1:2] + question[1:]
    run(d, shifted)
    evict_everything(d)
    cache = d.core.cache
    assert cache is not None and cache.host is not None
    wrong = {b.depth: b for b in cache.host.blocks()}
    cache.host = HostCache(cache.host.capacity, 16)
    parent = ROOT
    for depth, key in enumerate(chain_keys(question[: len(wrong) * 16], 16)):
        cache.host.put(
            HostBlock(
                parent, tuple(question[depth * 16 : (depth + 1) * 16]), wrong[depth].kv, depth
            )
        )
        parent = key
    rid = run(d, question, logprobs=20)
    assert d.final(rid).cached_tokens >= 64
    assert not same_prediction(reference, first_logprobs(d, rid))


def test_evict_restore_evict_restore_round_trips(runtime: LlamaRuntime, tokenize: Tokenize) -> None:
    """A block restored from host memory and evicted again is not copied twice (it is still
    there), and comes back again; the host tier stays within its bound throughout."""
    d = cached_driver(runtime)
    cache = d.core.cache
    assert cache is not None and cache.host is not None
    prompt = tokenize(chat("Tell me about Paris."))
    outputs = []
    for _ in range(3):
        rid = run(d, prompt, max_tokens=4, temperature=0.0)
        outputs.append(d.tokens(rid))
        saved = cache.stats.host_saved_blocks
        evict_everything(d)
        assert cache.host.bytes <= cache.host.capacity
    assert cache.stats.host_saved_blocks == saved  # the last evictions copied nothing new
    assert cache.stats.host_hit_tokens == 2 * (len(prompt) - 1) // 16 * 16
    assert outputs[1] == outputs[2]  # the same restored KV, the same split: the same tokens
    assert_idle(d)


def test_the_host_tier_keeps_to_its_bound_with_real_kv(
    runtime: LlamaRuntime, tokenize: Tokenize
) -> None:
    d = cached_driver(runtime)
    cache = d.core.cache
    assert cache is not None and cache.host is not None
    for i in range(5):
        run(d, tokenize(f"Topic {i}: " + "the quick brown fox jumps over the lazy dog " * 6))
        evict_everything(d)
        if i == 0:  # a bound of a few real blocks (each ~370 kB: 16 tokens of 30 layers' K, V)
            cache.host.capacity = 5 * next(cache.host.blocks()).size
        assert 0 < cache.host.bytes <= cache.host.capacity
    assert cache.host.dropped > 0


def test_a_cache_reset_drops_the_host_tier_too(runtime: LlamaRuntime, tokenize: Tokenize) -> None:
    """A reset means the tree and the cells were in doubt, and host blocks were copied from
    the cells the tree named: they go as well, and the prompt is prefilled again."""
    d = cached_driver(runtime)
    cache = d.core.cache
    assert cache is not None
    prompt = tokenize(chat("Tell me about Paris."))
    run(d, prompt)
    evict_everything(d)
    assert cache.host is not None and len(cache.host) > 0
    cache.reset()
    assert cache.host is not None and len(cache.host) == 0 and cache.stats.host_bytes == 0
    assert d.final(run(d, prompt)).cached_tokens == 0
    assert_idle(d)
