"""Prompt-lookup speculation: the lookup and the guess length on their own, then the engine
with the real model: greedy replies equal to those without speculation, guesses taken, the
budget kept."""

from __future__ import annotations

import math
from collections.abc import Callable

import llama_cpp
import pytest

from tinyserve import protocol as p
from tinyserve.engine.core import EngineCore
from tinyserve.engine.request.speculation import (
    CALIBRATION_ROWS,
    FIRST_PAUSE,
    MAX_PAUSE,
    NGRAMS,
    UNFITTED_BAR,
    Lookup,
    Odds,
    Speculation,
    StepCost,
)
from tinyserve.engine.runtime.runtime import LlamaRuntime

from .conftest import core_config
from .test_core import Driver


def test_a_guess_continues_the_last_occurrence_of_the_longest_ngram() -> None:
    lookup = Lookup()
    lookup.extend([1, 2, 3, 9, 9, 2, 3, 4, 5, 6, 7, 1, 2, 3])
    # [1, 2, 3] last occurred at the start, followed by 9, 9, 2; [2, 3] alone would say 4.
    assert lookup.match() == (3, 3)
    assert lookup.follow(3, 3) == [9, 9, 2]
    lookup.extend([8])
    assert lookup.match() is None  # [3, 8] and [2, 3, 8] never occurred before
    lookup.extend([2, 3])
    assert lookup.match() == (2, 14)  # [2, 3] came last before [8]; [3, 8, 2] is new
    assert lookup.follow(14, 2) == [8, 2]
    assert lookup.follow(14, 5) == [8, 2, 3, 8, 2]  # past the end: the period repeats


def test_a_guess_repeats_a_period_past_the_end() -> None:
    lookup = Lookup()
    lookup.extend([5, 6, 7, 5, 6, 7])
    assert lookup.match() == (3, 3)
    assert lookup.follow(3, 7) == [5, 6, 7, 5, 6, 7, 5]


def test_the_longest_match_says_which_occurrence_goes_on() -> None:
    passage = list(range(100, 112))  # 12 tokens
    lookup = Lookup()
    # The passage, then its last two tokens followed by something else, then the passage again.
    lookup.extend([*passage, 1, 2, 3, *passage[-2:], 50, 51, 9, *passage])
    # Its 2-gram last came before 50; the whole 12-gram only before 1, 2, 3.
    assert lookup.match() == (12, 12)
    assert lookup.follow(12, 3) == [1, 2, 3]
    lookup.extend([4])
    assert lookup.match() is None


def test_the_step_cost_is_fitted_from_steps_of_two_sizes() -> None:
    cost = StepCost()
    cost.observe(8, 0.050)
    assert cost.fit() is None and cost.bar(8) == UNFITTED_BAR  # one size: no slope yet
    for rows, seconds in [(1, 0.014), (9, 0.054), (4, 0.029), (8, 0.049)]:
        cost.observe(rows, seconds)
    fitted = cost.fit()
    assert fitted is not None
    fixed, per_row = fitted
    assert abs(per_row - 0.005) < 0.0005 and abs(fixed - 0.009) < 0.001
    # a guessed token must be likelier to hold in a batch of 8 than alone
    assert 0 < cost.bar(1) < cost.bar(8) < 1
    free = StepCost()
    for rows in (1, 2, 4, 8):
        free.observe(rows, 0.010)  # rows cost nothing more: guessing always pays
    assert free.bar(8) < 1e-9


def test_a_calibration_gives_the_slope_before_any_step_of_another_size() -> None:
    cost = StepCost()
    timed: list[int] = []

    def time_rows(rows: int) -> float:
        timed.append(rows)
        return 0.009 + 0.005 * rows

    cost.calibrate(time_rows)
    assert cost.calibrated and timed == [1, 1, 1] + [CALIBRATION_ROWS] * 3
    for _ in range(50):
        cost.observe(1, 0.014)  # a lone sequence's steps: one size only
    fitted = cost.fit()
    assert fitted is not None and abs(fitted[1] - 0.005) < 0.0005


def test_the_guess_length_follows_the_chance_of_holding_and_the_bar() -> None:
    spec = Speculation(max_k=8)
    spec.heard([5, 6, 7] * 10)
    odds = spec.odds[12]
    assert odds.chance == 6 / 7  # the prior of a 12-token match
    assert odds.length(bar=0.5, max_k=8) == 4  # (6/7)^4 > 0.5 > (6/7)^5
    assert odds.length(bar=0.0, max_k=8) == 8
    assert len(spec.guess(room=3, bar=0.0)) == 3 and spec.kind == 12  # never past its room
    for _ in range(20):
        spec.took(8, 8)
    assert odds.chance > 0.95 and odds.length(bar=0.5, max_k=8) == 8
    for _ in range(40):  # old evidence fades
        spec.took(2, 0)
    assert odds.length(bar=0.3, max_k=8) == 0


def test_each_kind_of_match_has_odds_of_its_own() -> None:
    spec = Speculation(max_k=8)
    assert set(spec.odds) == set(NGRAMS)
    spec.heard([1, 2, 9, 1, 2])  # the 2-gram [1, 2] matches, nothing longer
    for _ in range(20):
        assert spec.guess(room=100, bar=0.0)
        assert spec.kind == 2
        spec.took(4, 0)  # 2-gram guesses fail
    assert spec.guess(room=100, bar=0.3) == []  # not worth it any more: a pause begins
    spec.heard([3, 4, 5, 6, 7, 8, 10, 11, 12, 13, 14, 15, 1, 2, 3, 4, 5, 6, 7, 8, 10, 11, 12, 13])
    # A 12-token match is another kind: its own odds, its own length.
    assert len(spec.guess(room=100, bar=0.3)) == spec.odds[12].length(0.3, 8) > 0
    assert spec.kind == 12


def test_a_kind_of_guess_that_does_not_pay_pauses_then_probes_one_token() -> None:
    spec = Speculation(max_k=8)
    spec.heard([5, 6, 7] * 10)
    odds = spec.odds[12]
    assert spec.guess(room=100, bar=0.95) == []  # 6/7 is under the bar: a pause begins
    for _ in range(FIRST_PAUSE):
        assert spec.guess(room=100, bar=0.0) == []
    assert len(spec.guess(room=100, bar=0.95)) == 1  # the probe, whatever the bar
    spec.took(1, 1)
    assert spec.guess(room=100, bar=0.95) == []  # still not worth it: another pause, twice as long
    for _ in range(2 * FIRST_PAUSE):
        assert spec.guess(room=100, bar=0.0) == []
    assert len(spec.guess(room=100, bar=0.95)) == 1
    assert (spec.guessed, spec.accepted) == (1, 1)
    spec.took(1, 1)
    assert len(spec.guess(room=100, bar=0.0)) == 8  # worth it again: pauses start short again
    assert odds.pause == FIRST_PAUSE


def test_no_guess_not_even_a_probe_while_a_held_guess_would_not_pay() -> None:
    spec = Speculation(max_k=8, lookup=None)  # a draft model's guesses
    for _ in range(3 * MAX_PAUSE):  # a draft model as slow as the model itself
        assert spec.wanted(room=100, bar=1.2) == 0
    assert (spec.odds[spec.kind].cooldown, spec.guessed) == (0, 0)  # no pause: nothing learnt
    assert spec.wanted(room=100, bar=0.0) == 8


def test_a_draft_models_decode_raises_the_bar_by_its_cost_per_guessed_token() -> None:
    cost = StepCost()
    for rows, seconds in [(1, 0.012), (9, 0.044)]:
        cost.observe(rows, seconds, 20.0)  # fixed 8 ms, 4 ms a row
    assert cost.bar(1) == pytest.approx(4 / 12)
    assert cost.bar(1, extra=0.010) > 1  # a draft as slow as the model: never pays
    assert cost.bar(1, extra=0.001) == pytest.approx(5 / 12)  # one ten times faster


def test_guesses_among_several_sequences_pay_for_a_decode_of_their_own() -> None:
    cost = StepCost()
    for rows, seconds in [(1, 0.012), (9, 0.044)]:
        cost.observe(rows, seconds, 20.0)  # fixed 8 ms, 4 ms a row
    assert cost.apart(1) == 0  # a lone sequence's guesses ride in its own ubatch
    assert cost.apart(8) == pytest.approx(8 * 0.008 / 0.040)  # the fixed part, in tokens
    odds = Odds(held=98.0, failed=2.0)  # a guessed token holds 98% of the time
    assert odds.length(cost.bar(8), 8) == 8  # their rows alone would pay among eight
    assert odds.length(cost.bar(8), 8, cost.apart(8)) == 0  # with their own decode: not
    assert odds.length(cost.bar(2), 8, cost.apart(2)) == 8  # among two they do
    # Nor does a probe run among eight: it would cost a decode for one token.
    assert odds.wanted(room=100, bar=0.95, max_k=8, apart=cost.apart(8)) == 0
    assert (odds.cooldown, odds.probing) == (0, False)


REPEATING = [
    "Copy this list exactly: apple, banana, cherry, apple, banana, cherry, apple, banana,",
    "def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return a + b\n\ndef",
    '{"name": "Ada", "city": "London", "name": "Ada", "city": "London", "name":',
    "1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2, 3,",
]
FREE = ["Once upon a time, in a small village by the sea,", "The capital of France is"]


class FreeRows(StepCost):
    """A step cost under which every guess pays, so that the tests guess whatever this
    machine's timings say."""

    def bar(self, batch: int, extra: float = 0.0) -> float:
        return 0.0

    def apart(self, batch: int) -> float:
        return 0.0


def guessing_core(runtime: LlamaRuntime, **settings: object) -> EngineCore:
    core = EngineCore(core_config(**{"speculate": "ngram", **settings}), runtime)
    core.scheduler.guessing.step_cost = FreeRows()
    return core


def run_all(
    runtime: LlamaRuntime, prompts: list[list[int]], speculate: str, **sampling: object
) -> tuple[Driver, list[str]]:
    driver = Driver(guessing_core(runtime, speculate=speculate))
    rids = [driver.submit(ids, max_tokens=40, **sampling) for ids in prompts]
    driver.run(max_ticks=2000)
    return driver, rids


def test_greedy_replies_are_the_same_with_speculation_on_and_off(
    exact_runtime: LlamaRuntime, tokenize: Callable[[str], list[int]]
) -> None:
    prompts = [tokenize(text) for text in REPEATING + FREE]
    off, off_ids = run_all(exact_runtime, prompts, "off")
    on, on_ids = run_all(exact_runtime, prompts, "ngram")
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


def logprobs(driver: Driver, rid: str) -> list[list[object]]:
    return [entry for update in driver.updates[rid] for entry in update.logprobs]


DIGITS = 'root ::= (" " [0-9] ",")+'


@pytest.mark.parametrize(
    "sampling",
    [
        {"temperature": 0.8, "seed": 7},
        {"temperature": 1.0, "seed": 3, "top_p": 0.9, "repetition_penalty": 1.1},
        {"logprobs": 2},
        {"min_tokens": 30},
        {"temperature": 0.7, "seed": 11, "grammar": DIGITS},
    ],
    ids=["sampled", "top-p-and-penalty", "logprobs", "min-tokens", "grammar"],
)
def test_every_kind_of_request_gives_the_same_reply_with_speculation_on_and_off(
    exact_runtime: LlamaRuntime, tokenize: Callable[[str], list[int]], sampling: dict[str, object]
) -> None:
    prompts = [tokenize(REPEATING[3]), tokenize(REPEATING[0])]
    off, off_ids = run_all(exact_runtime, prompts, "off", **sampling)
    on, on_ids = run_all(exact_runtime, prompts, "ngram", **sampling)
    for a, b in zip(off_ids, on_ids, strict=True):
        assert on.tokens(b) == off.tokens(a)
        assert logprobs(on, b) == logprobs(off, a)
        assert on.final(b).finish_reason == off.final(a).finish_reason
    accepted = sum(sum(g[2] for g in on.finishes[rid].timeline.guesses) for rid in on_ids)
    assert accepted > 0  # guesses were made and taken, not skipped for this kind of request


def test_a_sampled_distribution_is_kept_where_guesses_are_checked(
    runtime: LlamaRuntime, tokenize: Callable[[str], list[int]]
) -> None:
    """Among the 4 likeliest tokens at temperature 2, each position's pick follows the
    sampler's distribution, computed from the position's own logprobs: a chi-square test of
    the picks' ranks pooled over every position of 160 seeded replies, which guessed wherever
    their text still repeated the prompt. The seeds are fixed, so the verdict is too."""
    prompt = tokenize("red, blue, green, red, blue, green, red, blue, green, red,")
    temperature, k, n_requests = 2.0, 4, 160
    sampling = {"temperature": temperature, "top_k": k, "logprobs": k}
    driver = Driver(guessing_core(runtime, speculate="ngram", max_queue=n_requests))
    rids = [
        driver.submit(prompt, max_tokens=6, seed=seed, **sampling) for seed in range(n_requests)
    ]
    driver.run(max_ticks=5000)
    expected, observed = [0.0] * k, [0] * k
    steps = guessed_steps = 0
    for rid in rids:
        for token, entry in zip(driver.tokens(rid), logprobs(driver, rid), strict=True):
            ids = [t for t, _ in entry[1]]
            weights = [math.exp(logprob / temperature) for _, logprob in entry[1]]
            total = sum(weights)
            for rank, weight in enumerate(weights):
                expected[rank] += weight / total
            observed[ids.index(token)] += 1  # top-k: the pick is one of the k
        timeline = driver.finishes[rid].timeline
        steps += sum(run.ticks for run in timeline.decode_runs)
        guessed_steps += len(timeline.guesses)
    chi_square = sum((o - e) ** 2 / e for o, e in zip(observed, expected, strict=True))
    assert chi_square < 16.27, (observed, expected)  # 3 degrees of freedom, p = 0.001
    # the steps that checked guesses: where a reply still repeated the prompt (125 of 665)
    assert guessed_steps >= n_requests // 2, (guessed_steps, steps)


@pytest.mark.parametrize("max_tokens", [1, 2, 7])
def test_max_tokens_and_the_budget_hold_with_guesses(
    runtime: LlamaRuntime, tokenize: Callable[[str], list[int]], max_tokens: int
) -> None:
    driver = Driver(guessing_core(runtime))
    rid = driver.submit(tokenize(REPEATING[3]), max_tokens=max_tokens)
    long_prompt = driver.submit(list(range(200, 330)), max_tokens=4)  # prefills beside it
    driver.run()
    assert len(driver.tokens(rid)) == max_tokens
    assert driver.final(rid).finish_reason == p.FINISH_LENGTH
    assert max(b.tokens for b in driver.batches) <= 64  # max_batch_tokens
    chunks = [c.tokens for c in driver.finishes[long_prompt].timeline.chunks]
    assert chunks == [32, 32, 32, 32, 2]  # guesses took no prompt's place
    # and no tick that prefilled guessed: the one decoding sequence wrote its token alone
    assert all(b.decode_tokens <= 1 for b in driver.batches if b.prefill_tokens)
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
