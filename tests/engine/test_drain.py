"""The drain rate behind a 503's Retry-After: counted over time with work, not wall time."""

from __future__ import annotations

import pytest

from tinyserve.engine.request.sequence import Sequence, SequenceStatus
from tinyserve.engine.scheduling.drain import DrainRate
from tinyserve.protocol import SamplingParams, Submit

S = 1_000_000_000  # ns
CHUNK = 128
SLOTS = 8


def running(max_tokens: int, generated: int = 0, prompt: int = 8, n_past: int = 8) -> Sequence:
    request = Submit("r", "f" * 32, list(range(prompt)), SamplingParams(), max_tokens, arrival_ns=0)
    status = SequenceStatus.DECODE if n_past >= prompt else SequenceStatus.PREFILL
    return Sequence(request, status=status, n_past=n_past, output_ids=[1] * generated)


def busy(drain: DrainRate, start_ns: int, seconds: float, step_s: float = 0.1) -> int:
    """Steps with requests running for ``seconds`` from ``start_ns``; the time after."""
    now = start_ns
    for _ in range(round(seconds / step_s)):
        drain.step(now, running=True)
        now += int(step_s * S)
    drain.step(now, running=True)
    return now


def test_nothing_known_is_zero() -> None:
    assert DrainRate(CHUNK, SLOTS).rate([]) == 0.0


def test_finishes_per_second_of_work() -> None:
    drain = DrainRate(CHUNK, SLOTS)
    now = busy(drain, 0, 5.0)
    for _ in range(10):
        drain.finished()
    assert drain.rate([]) == pytest.approx(2.0)  # 10 in 5 s of work
    now = busy(drain, now, 15.0)
    assert drain.rate([]) == 0.0  # they left the window: 10 s of work ago


def test_idle_time_neither_dilutes_nor_ages_the_rate() -> None:
    drain = DrainRate(CHUNK, SLOTS)
    now = busy(drain, 0, 10.0)
    for _ in range(30):
        drain.finished()
    assert drain.rate([]) == pytest.approx(3.0)
    # A minute with nothing running (the loop still steps now and then), then a burst.
    for _ in range(60):
        now += S
        drain.step(now, running=False)
    assert drain.rate([]) == pytest.approx(3.0)
    busy(drain, now, 2.0)
    assert drain.rate([]) == pytest.approx(3.0)  # the same 30, still within 10 s of work


def test_a_first_finish_moments_into_the_work_is_not_a_huge_rate() -> None:
    drain = DrainRate(CHUNK, SLOTS)
    busy(drain, 0, 0.1, step_s=0.05)
    drain.finished()
    assert drain.rate([]) == pytest.approx(1.0)  # over at least a second


def test_before_any_finish_the_running_requests_pace_stands_in() -> None:
    drain = DrainRate(CHUNK, SLOTS)
    assert drain.rate([running(32)]) == 0.0  # no step timed yet
    busy(drain, 0, 1.0, step_s=0.05)
    # 8 sequences with 32, 32, ... tokens left at 50 ms a step leave in 1.6 s: 5 a second.
    assert drain.rate([running(40, generated=8)] * 8) == pytest.approx(5.0)
    # A prompt still to prefill adds a step per chunk: 300 tokens, 3 chunks of 128, + 29.
    assert drain.rate([running(29, prompt=300, n_past=0)] * 8) == pytest.approx(5.0)


def test_before_a_wave_has_finished_the_pace_counts_too() -> None:
    drain = DrainRate(CHUNK, SLOTS)
    busy(drain, 0, 2.0, step_s=0.05)
    drain.finished()  # one request ended early: 0.5 a second, measured
    wave = [running(40, generated=8)] * 7  # 32 steps left each: 7 in 1.6 s
    assert drain.rate(wave) == pytest.approx(7 / 1.6)
    for _ in range(SLOTS - 1):
        drain.finished()  # a whole wave: the count alone
    assert drain.rate(wave) == pytest.approx(SLOTS / 2.0)
