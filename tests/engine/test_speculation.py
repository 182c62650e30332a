"""Prompt-lookup speculation: the lookup and the guess length on their own, then the engine
with the real model: greedy replies equal to those without speculation, guesses taken, the
budget kept."""

from __future__ import annotations

from collections.abc import Callable

import llama_cpp
import pytest

from tinyserve import protocol as p
from tinyserve.engine.core import EngineCore
from tinyserve.engine.runtime import LlamaRuntime
from tinyserve.engine.speculation import COOLDOWN_TICKS, Lookup, Speculation

from .conftest import core_config
from .test_core import Driver


def test_a_guess_continues_the_last_occurrence_of_the_longest_ngram() -> None:
    lookup = Lookup()
    lookup.extend([1, 2, 3, 9, 9, 2, 3, 4, 5, 6, 7, 1, 2, 3])
    # [1, 2, 3] last occurred at the start, followed by 9, 9, 2; [2, 3] alone would say 4.
    assert lookup.guess(3) == [9, 9, 2]
    lookup.extend([8])
    assert lookup.guess(3) == []  # [3, 8] and [2, 3, 8] never occurred before
    lookup.extend([2, 3])
    assert lookup.guess(2) == [8, 2]  # [2, 3] came last before [8]; [3, 8, 2] is new
    assert lookup.guess(5) == [8, 2, 3, 8, 2]  # past the end: the period repeats


def test_a_guess_repeats_a_period_past_the_end() -> None:
    lookup = Lookup()
    lookup.extend([5, 6, 7, 5, 6, 7])
    assert lookup.guess(7) == [5, 6, 7, 5, 6, 7, 5]


def test_the_guess_length_adapts_down_to_a_pause() -> None:
    spec = Speculation(max_k=8)
    spec.lookup.extend([5, 6, 7] * 10)
    assert len(spec.guess(room=100)) == 8
    assert len(spec.guess(room=3)) == 3  # never past the room it is given
    spec.took(8, 3)
    assert spec.k == 8  # some taken: as it was
    for k in (4, 2, 1, 0):
        spec.took(spec.k, 0)
        assert spec.k == k
    for _ in range(COOLDOWN_TICKS):
        assert spec.guess(room=100) == []
    assert len(spec.guess(room=100)) == 1  # then one token again
    spec.took(1, 1)
    assert spec.k == 2
    assert (spec.guessed, spec.accepted) == (8 + 8 + 4 + 2 + 1 + 1, 3 + 1)  # what took() heard


REPEATING = [
    "Copy this list exactly: apple, banana, cherry, apple, banana, cherry, apple, banana,",
    "def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return a + b\n\ndef",
    '{"name": "Ada", "city": "London", "name": "Ada", "city": "London", "name":',
    "1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2, 3,",
]
FREE = ["Once upon a time, in a small village by the sea,", "The capital of France is"]


def run_all(
    runtime: LlamaRuntime, prompts: list[list[int]], speculate: str, **sampling: object
) -> tuple[Driver, list[str]]:
    driver = Driver(EngineCore(core_config(speculate=speculate), runtime))
    rids = [driver.submit(ids, max_tokens=40, **sampling) for ids in prompts]
    driver.run(max_ticks=2000)
    return driver, rids


def test_greedy_replies_are_the_same_with_speculation_on_and_off(
    runtime: LlamaRuntime, tokenize: Callable[[str], list[int]]
) -> None:
    prompts = [tokenize(text) for text in REPEATING + FREE]
    off, off_ids = run_all(runtime, prompts, "off")
    on, on_ids = run_all(runtime, prompts, "ngram")
    for a, b in zip(off_ids, on_ids, strict=True):
        assert on.tokens(b) == off.tokens(a)
        assert on.text(b) == off.text(a)
        assert on.final(b).finish_reason == off.final(a).finish_reason
    timelines = [on.finishes[rid].timeline for rid in on_ids]
    accepted = [sum(g[2] for g in t.guesses) for t in timelines]
    assert sum(accepted[: len(REPEATING)]) > 0, accepted  # the repeating texts were guessed
    # fewer steps than tokens: some steps made more than one
    assert len(on.batches) < len(off.batches)
    assert not any(t.guesses for t in (off.finishes[rid].timeline for rid in off_ids))


def test_sampled_and_logprob_requests_are_not_guessed(
    runtime: LlamaRuntime, tokenize: Callable[[str], list[int]]
) -> None:
    prompts = [tokenize(REPEATING[3])]
    sampled, [a] = run_all(runtime, prompts, "ngram", temperature=0.8, seed=7)
    with_logprobs, [b] = run_all(runtime, prompts, "ngram", logprobs=2)
    for driver, rid in ((sampled, a), (with_logprobs, b)):
        assert driver.finishes[rid].timeline.guesses == []
        assert len(driver.tokens(rid)) == 40


@pytest.mark.parametrize("max_tokens", [1, 2, 7])
def test_max_tokens_and_the_budget_hold_with_guesses(
    runtime: LlamaRuntime, tokenize: Callable[[str], list[int]], max_tokens: int
) -> None:
    driver = Driver(EngineCore(core_config(), runtime))
    rid = driver.submit(tokenize(REPEATING[3]), max_tokens=max_tokens)
    long_prompt = driver.submit(list(range(200, 330)), max_tokens=4)  # prefills beside it
    driver.run()
    assert len(driver.tokens(rid)) == max_tokens
    assert driver.final(rid).finish_reason == p.FINISH_LENGTH
    assert max(b.tokens for b in driver.batches) <= 64  # max_batch_tokens
    chunks = [c.tokens for c in driver.finishes[long_prompt].timeline.chunks]
    assert chunks == [32, 32, 32, 32, 2]  # guesses took no prompt's place
    load = driver.core.load()
    assert (load.running, load.blocks_used) == (0, 0)


def test_a_stop_string_inside_a_guessed_run_ends_it_there(
    runtime: LlamaRuntime, tokenize: Callable[[str], list[int]]
) -> None:
    prompt = tokenize(REPEATING[3])
    plain, [a] = run_all(runtime, [prompt], "off")
    text = plain.text(a).decode()
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    off, [b] = run_all(runtime, [prompt], "off", stop=[stop])
    on, [c] = run_all(runtime, [prompt], "ngram", stop=[stop])
    assert on.text(c) == off.text(b)
    assert on.final(c).finish_reason == off.final(b).finish_reason == p.FINISH_STOP
    # the slot keeps exactly the tokens it reports, guesses past the stop dropped
    core = on.core
    slot_tokens = core.scheduler.kv.kept.tokens
    assert any(slot_tokens)
    for slot, tokens in enumerate(slot_tokens):
        if tokens:
            last = llama_cpp.llama_memory_seq_pos_max(core.scheduler.kv.runtime._memory, slot)
            assert last + 1 == len(tokens)
