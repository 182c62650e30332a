"""Admission math: never-fits 400, queue_full 503, Retry-After from drain."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tinyserve import protocol
from tinyserve.frontend.link.board_view import Limits, NodeLoad
from tinyserve.frontend.request.admission import (
    PROMPT_TOO_LONG,
    RETRY_MAX_S,
    RETRY_MIN_S,
    RETRY_UNKNOWN_S,
    admit,
    admit_embedding,
    engine_refusal,
    fitted_max_tokens,
    retry_after_s,
)

LIMITS = Limits(max_queue=8, n_ctx=1600)


def load(**changes: float) -> NodeLoad:
    base = {"waiting": 0, "running": 0, "drain_rate": 2.0}
    base.update(changes)
    return NodeLoad(**base)  # type: ignore[arg-type]


def test_admits_when_there_is_room() -> None:
    assert admit(10, 6, LIMITS, load()) is None


def test_never_fits_is_a_400() -> None:
    # A slot of 1600 cells: 1601 tokens can never fit, however empty the engine.
    rejection = admit(1000, 601, LIMITS, load())
    assert rejection is not None
    assert rejection.status == 400 and rejection.label == protocol.REJECT_TOO_LONG
    assert rejection.retry_after is None
    assert admit(1000, 600, LIMITS, load()) is None


def test_over_the_context_or_the_prompt_limit_is_a_400_naming_it() -> None:
    small = Limits(max_queue=8, n_ctx=100)
    assert admit(90, 10, small, load()) is None
    rejection = admit(91, 10, small, load())
    assert rejection is not None and rejection.status == 400
    assert rejection.label == protocol.REJECT_TOO_LONG
    assert rejection.message.startswith("prompt is too long: 91 tokens > 99 maximum")
    assert admit(5, 10, small, load(), max_prompt_tokens=5) is None
    rejection = admit(6, 10, small, load(waiting=100), max_prompt_tokens=5)
    assert rejection is not None and rejection.status == 400
    assert rejection.label == PROMPT_TOO_LONG and "at most 5" in rejection.message


def test_an_output_length_over_what_fits_is_clamped_to_it() -> None:
    assert fitted_max_tokens(90, 10, n_ctx=100, limit=64) == 10
    assert fitted_max_tokens(90, 32000, n_ctx=100, limit=64) == 10  # the context left
    assert fitted_max_tokens(10, 32000, n_ctx=100, limit=64) == 64  # --max-tokens-limit
    assert fitted_max_tokens(100, 8, n_ctx=100, limit=64) == 1  # never fits: admit says so
    assert admit(100, 1, Limits(max_queue=8, n_ctx=100), load()) is not None


def test_queue_full_counts_engine_waiting_and_pending() -> None:
    assert admit(10, 6, LIMITS, load(waiting=4, pending_requests=3)) is None
    rejection = admit(10, 6, LIMITS, load(waiting=4, pending_requests=4))
    assert rejection is not None
    assert (rejection.status, rejection.label) == (503, protocol.REJECT_QUEUE_FULL)
    assert rejection.retry_after is not None


def test_requests_bound_for_free_slots_do_not_count_as_queued() -> None:
    limits = Limits(max_queue=2, n_ctx=4096, slots=4)
    # 1 running, 3 slots free: 3 of the 4 pending go straight to a slot, 1 waits.
    assert admit(10, 6, limits, load(running=1, pending_requests=4)) is None
    assert admit(10, 6, limits, load(running=1, pending_requests=5)) is not None
    assert admit(10, 6, limits, load(running=4, waiting=2)) is not None


def test_a_long_request_waits_for_a_slot_like_any_other() -> None:
    """Each slot has cells of its own: a request that fits one is never short of KV, only of
    a slot, and the queue's bound alone turns it away."""
    limits = Limits(max_queue=2, n_ctx=4096, slots=4)
    assert admit(2000, 2000, limits, load(running=4, waiting=1)) is None
    rejection = admit(2000, 2000, limits, load(running=4, waiting=2))
    assert rejection is not None and rejection.label == protocol.REJECT_QUEUE_FULL


def test_draining_engine_takes_nothing() -> None:
    rejection = admit(10, 6, LIMITS, load(draining=True))
    assert rejection is not None
    assert (rejection.status, rejection.label) == (503, protocol.REJECT_DRAINING)


def test_retry_after_follows_drain_rate() -> None:
    assert retry_after_s(10, 2.0) == 5
    assert retry_after_s(10, 0.5) == 20
    assert retry_after_s(3, 2.0) == 2  # 1.5 s rounds up


def test_retry_after_is_clamped() -> None:
    assert retry_after_s(1, 100.0) == RETRY_MIN_S
    assert retry_after_s(0, 5.0) == RETRY_MIN_S
    assert retry_after_s(1000, 1.0) == RETRY_MAX_S


def test_retry_after_without_a_drain_rate_is_short() -> None:
    # The engine has no rate yet (just started): come back soon for one, however long the
    # queue ahead (a rate guessed for it told a cold burst's clients 60 s: bench/retry_after.py).
    for ahead in (1, 7, 1000):
        assert retry_after_s(ahead, 0.0) == RETRY_UNKNOWN_S


def test_queue_full_retry_after_grows_with_the_queue_ahead() -> None:
    fast = admit(10, 6, LIMITS, load(waiting=8, drain_rate=1.0))
    long_queue = admit(10, 6, LIMITS, load(waiting=8, pending_requests=12, drain_rate=1.0))
    slow = admit(10, 6, LIMITS, load(waiting=8, drain_rate=0.1))
    assert fast is not None and long_queue is not None and slow is not None
    # The 8 queued must leave (one a second), not just one: the clients refused with this one
    # would all come back when a single place is free.
    assert fast.retry_after == 8
    assert long_queue.retry_after == 20
    assert slow.retry_after == RETRY_MAX_S


def test_engine_rejections_map_to_status() -> None:
    too_long = engine_refusal(protocol.REJECT_TOO_LONG, load())
    assert (too_long.status, too_long.retry_after) == (400, None)
    full = engine_refusal(protocol.REJECT_QUEUE_FULL, load(waiting=3, drain_rate=1.0))
    assert (full.status, full.reason, full.retry_after) == (503, "queue_full", 4)
    draining = engine_refusal(protocol.REJECT_DRAINING, load())
    assert (draining.status, draining.reason) == (503, "draining")


@given(
    prompt=st.integers(1, 4000),
    max_tokens=st.integers(1, 4000),
    pending=st.integers(0, 100),
    waiting=st.integers(0, 20),
    rate=st.floats(0, 100),
)
def test_admitted_requests_fit(
    prompt: int, max_tokens: int, pending: int, waiting: int, rate: float
) -> None:
    current = load(pending_requests=pending, waiting=waiting, drain_rate=rate)
    rejection = admit(prompt, max_tokens, LIMITS, current)
    if rejection is None:  # no free slots (LIMITS.slots is 0): it queues, and there is room
        assert waiting + pending < LIMITS.max_queue
        assert prompt + max_tokens <= LIMITS.n_ctx
    elif rejection.status == 503:
        assert rejection.label == protocol.REJECT_QUEUE_FULL
        assert rejection.retry_after is not None
        assert RETRY_MIN_S <= rejection.retry_after <= RETRY_MAX_S
    else:
        assert prompt + max_tokens > LIMITS.n_ctx


@pytest.mark.parametrize("rate", [0.25, 1.0, 4.0])
def test_retry_after_is_monotonic_in_queue(rate: float) -> None:
    values = [retry_after_s(n, rate) for n in range(0, 200)]
    assert values == sorted(values)


def test_embedding_requests_are_bounded_by_their_own_queue() -> None:
    """Generation requests waiting do not count against embedding ones, nor the other way."""
    assert admit_embedding(LIMITS, load(waiting=50, embed_waiting=7)) is None
    refusal = admit_embedding(LIMITS, load(embed_waiting=8))
    assert refusal is not None
    assert (refusal.status, refusal.label, refusal.retry_after) == (
        503,
        protocol.REJECT_QUEUE_FULL,
        RETRY_UNKNOWN_S,
    )
    assert admit(10, 6, LIMITS, load(embed_waiting=100)) is None
    draining = admit_embedding(LIMITS, load(draining=True))
    assert draining is not None and draining.label == protocol.REJECT_DRAINING
