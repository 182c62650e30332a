"""Where a request's KV comes from at its slot grant (``engine/kv/kv_space.py``), with the real
model: the cells a free slot kept, the prefix cache in host memory, or nothing. (A failing
prefix cache: ``test_failures.py``.)"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tinyserve.engine.core import EngineCore
from tinyserve.engine.kv.host_cache import (
    MISS_NO_MATCH,
    MISS_SHORT,
    TIER_HOST,
    TIER_SLOT,
    HostCache,
)
from tinyserve.engine.kv.resident import common_start
from tinyserve.engine.runtime.runtime import LlamaRuntime

from .conftest import core_config
from .test_core import Driver
from .test_forks import submit_choices
from .test_prompt_logprobs import submit as submit_scored

Tokenize = Callable[[str], list[int]]

SYSTEM = (
    "<|im_start|>system\n"
    + "You are a helpful assistant who answers questions about geography, history and "
    "science with short precise facts. Always be concise and cite well known sources. "
    * 3
    + "<|im_end|>\n"
)
OTHER = list(range(300, 340))  # a prompt nothing else starts with


def chat(question: str) -> str:
    return f"{SYSTEM}<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"


# Measured by bench/chunking_noise.py on these prompts (about 105 tokens): chunks of 7-48
# tokens moved the top-5 first-token logprobs by up to 0.244 nats (and swapped two near-tied
# tokens); a 96-token cache hit matched a one-piece prefill exactly; the same tokens' KV
# shifted by one position, handed over by the host cache, moved them by 1.532 nats. 0.6 sits
# between chunking noise and a wrong reuse.
TOLERANCE = 0.6


def first_logprobs(d: Driver, rid: str) -> dict[int, float]:
    entries = [e for u in d.updates[rid] for e in u.logprobs]
    return {token: lp for token, lp in entries[0][1]}


def same_prediction(a: dict[int, float], b: dict[int, float]) -> bool:
    top_a, top_b = list(a)[:5], list(b)[:5]
    return top_a == top_b and max(abs(a[t] - b[t]) for t in top_a) < TOLERANCE


def cached_driver(runtime: LlamaRuntime, **overrides: Any) -> Driver:
    """Chunks of 256: a prompt's uncached rest is prefilled in one piece, as a cold one is."""
    return Driver(EngineCore(core_config(chunk=256, max_batch_tokens=256, **overrides), runtime))


def run(d: Driver, prompt: list[int], **kw: Any) -> str:
    rid = d.submit(prompt, **{"max_tokens": 2, **kw})
    d.run()
    return rid


def cold_prediction(runtime: LlamaRuntime, prompt: list[int]) -> dict[int, float]:
    """First-token logprobs of ``prompt`` with nothing reused, prefilled in one piece."""
    d = cached_driver(runtime, prefix_cache=False)
    return first_logprobs(d, run(d, prompt, logprobs=20))


def hand_over_instead(d: Driver, prompt: list[int], slot: int = 0) -> None:
    """Sabotage ``d``'s prefix cache: it holds nothing but the KV that ``slot`` holds now
    (another prompt's), filed under ``prompt``'s tokens, as a wrong reuse would hand it
    over to ``prompt``."""
    cache = d.core.kv.cache
    assert cache is not None
    wrong = HostCache(cache.layout, cache.block_size, 64 * 2**20, d.core.cache_stats)
    assert wrong.store(prompt[:-1], lambda: d.core.runtime.save_seq(slot)) > 0
    d.core.kv.cache = wrong


QUESTION = "Name three rivers in Europe."


@pytest.fixture(scope="module")
def reference(runtime: LlamaRuntime, tokenize: Tokenize) -> dict[int, float]:
    return cold_prediction(runtime, tokenize(chat(QUESTION)))


def test_a_conversations_next_turn_goes_to_the_slot_that_kept_it_and_moves_nothing(
    runtime: LlamaRuntime, tokenize: Tokenize
) -> None:
    """Though a lower slot is free, the second turn takes the slot holding the first turn's
    prompt and reply, and prefills only what is new; its first token is predicted as a cold
    prefill of the whole prompt predicts it."""
    d = cached_driver(runtime)
    d.submit(tokenize("Hello there."), max_tokens=4)
    d.step()  # slot 0 from here on
    first = tokenize(chat("Tell me about Paris."))
    rid = d.submit(first, max_tokens=8, ignore_eos=True)  # slot 1
    d.run()
    kept = len(first) + 8 - 1  # the last generated token never went in
    turn = "<|im_end|>\n<|im_start|>user\nAnd Rome?<|im_end|>\n<|im_start|>assistant\n"
    second = first + d.tokens(rid) + tokenize(turn)[1:]
    stats = d.core.cache_stats
    slot_hits, restored = stats.hit_tokens[TIER_SLOT], stats.restored_tokens
    rid2 = run(d, second, logprobs=20)
    final = d.final(rid2)
    assert final.timeline is not None and final.timeline["slot"]["index"] == 1
    assert final.cached_tokens == kept and "restore" not in final.timeline
    assert sum(c["tokens"] for c in final.timeline["prefill"]) == len(second) - kept
    assert (stats.hit_tokens[TIER_SLOT] - slot_hits, stats.restored_tokens) == (kept, restored)
    assert same_prediction(cold_prediction(runtime, second), first_logprobs(d, rid2))


def test_a_prompt_left_in_the_cache_is_restored_into_the_slot_that_matters_least(
    runtime: LlamaRuntime, tokenize: Tokenize, reference: dict[int, float]
) -> None:
    """No free slot keeps the system prompt any more, the cache does: its blocks and the
    start of the block it ends in are written into the offered slot kept longest ago (next to
    the running one), and the first token is predicted as with no cache."""
    d = cached_driver(runtime)
    earlier, question = tokenize(chat("What is the capital of France?")), tokenize(chat(QUESTION))
    run(d, earlier)  # slot 0 keeps it, the cache holds its blocks
    for n in range(1, 4):  # slots 1, 2, 3: the ones that kept nothing
        run(d, [t + n for t in OTHER])
    d.submit(OTHER, max_tokens=20)  # slot 0, kept longest ago: the prompt leaves every slot
    d.step()
    rid = run(d, question, logprobs=20)
    shared = common_start(earlier, question)
    assert shared % 16  # it ends inside a block: whole blocks and part of one
    final = d.final(rid)
    assert final.timeline is not None and final.timeline["slot"]["index"] == 1
    restore = final.timeline["restore"]
    assert (restore["tier"], restore["tokens"]) == (TIER_HOST, shared)
    assert final.cached_tokens == shared
    stats = d.core.cache_stats
    assert stats.restored_tokens == stats.hit_tokens[TIER_HOST] == shared
    assert same_prediction(reference, first_logprobs(d, rid))


def test_a_wrong_reuse_fails_the_same_check(
    runtime: LlamaRuntime, tokenize: Tokenize, reference: dict[int, float]
) -> None:
    """The check above can fail: KV of the question shifted by one position, filed in the
    cache under the question's own tokens (what a key that ignored positions would do)."""
    d = cached_driver(runtime)
    question = tokenize(chat(QUESTION))
    shifted = question[:1] + tokenize("Note:")[1:2] + question[1:]
    run(d, shifted)  # slot 0 holds it now
    hand_over_instead(d, question)
    rid = run(d, question, logprobs=20)
    assert d.final(rid).cached_tokens == len(question) - 1
    assert not same_prediction(reference, first_logprobs(d, rid))


# Shorter than a block, sharing their first words.
DRAGON = "Write a short story about a dragon. Once upon a time,"
ROBOT = "Write a short story about a robot. Once upon a time,"


def test_a_short_prompt_is_restored_from_the_start_of_a_cached_block(
    runtime: LlamaRuntime, tokenize: Tokenize
) -> None:
    first, second = tokenize(DRAGON), tokenize(ROBOT)
    shared = common_start(first, second)
    assert 0 < shared < len(second) < 16
    d = cached_driver(runtime)
    run(d, first, max_tokens=8)  # slot 0 keeps it; a block of its prompt and reply is cached
    run(d, OTHER)  # slot 1
    rid = run(d, second, logprobs=20)
    final = d.final(rid)
    # Less than a block in common with slot 0's: the cache writes its start into the slot
    # that matters least, the lowest that keeps nothing.
    assert final.timeline is not None and final.timeline["slot"]["index"] == 2
    assert final.cached_tokens == final.timeline["restore"]["tokens"] == shared
    assert same_prediction(cold_prediction(runtime, second), first_logprobs(d, rid))


def test_prompt_logprobs_and_n_gt_1_followers_reuse_nothing(
    runtime: LlamaRuntime, tokenize: Tokenize
) -> None:
    """A request that wants its prompt's logprobs prefills every position (cached ones have
    no logits); a follower copies its leader's prompt instead of reusing."""
    d = cached_driver(runtime)
    prompt = tokenize(chat("Tell me about Paris."))
    run(d, prompt)  # slot 0 keeps it, the cache holds it
    submit_scored(d, "scored", prompt, 1, 0)
    d.run()
    scored = d.final("scored").timeline
    assert scored is not None and d.final("scored").cached_tokens == 0
    assert sum(c["tokens"] for c in scored["prefill"]) == len(prompt)
    assert scored["prefix_recomputed_tokens"] == (len(prompt) - 1) // 16 * 16  # the cache's
    ids = submit_choices(d, prompt, 2, 4, temperature=0.0)
    d.run()
    leader, follower = (d.final(rid).timeline or {} for rid in ids)
    assert (leader["slot"]["index"], leader["prefix_reused_tokens"]) == (0, len(prompt) - 1)
    assert (follower["slot"]["index"], follower["prefix_reused_tokens"]) == (1, 0)
    assert follower["shared_prefill"] == {"request_id": ids[0], "tokens": len(prompt)}
    assert d.tokens(ids[1]) == d.tokens(ids[0])


def test_lookups_hits_and_misses_are_counted(runtime: LlamaRuntime, tokenize: Tokenize) -> None:
    d = cached_driver(runtime)
    short, long = tokenize("Hi"), tokenize(chat("Something new entirely"))
    run(d, short)
    run(d, long)
    stats = d.core.cache_stats
    assert stats.misses == {MISS_SHORT: 1, MISS_NO_MATCH: 1} and not stats.hit_tokens
    assert (stats.lookups, stats.lookup_tokens) == (2, len(short) - 1 + len(long) - 1)
    run(d, long)
    assert stats.hit_tokens == {TIER_SLOT: len(long) - 1}
    assert stats.lookups == 3 and sum(stats.misses.values()) == 2


def test_no_prefix_cache_reuses_nothing(runtime: LlamaRuntime) -> None:
    d = Driver(EngineCore(core_config(prefix_cache=False), runtime))
    prompt = list(range(100, 140))
    run(d, prompt)
    again = run(d, prompt)
    assert d.final(again).cached_tokens == 0
