"""Admission: turn a request away before it reaches the engine when it can never be served
(a 400: over ``--max-prompt-tokens`` or a slot's context) or not soon (a 503: the queue of
requests waiting for a slot is full).

Transport-free: the figures come in as plain values (read from the board and the handshake by
the caller) and a ``Rejection`` or ``None`` comes out. The engine re-checks on receipt and is
authoritative; this check exists so that a full node answers in microseconds instead of a round
trip, and so the answer carries a useful ``Retry-After``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tinyserve import capacity, protocol

RETRY_MIN_S = 1
RETRY_MAX_S = 60
# Retry-After while the engine knows no drain rate (engine/drain.py: nothing has finished or
# run since it started): it has one within a step or two of having work, so come back soon
# for an estimate; one more 503 costs a client less than sleeping through an idle engine.
RETRY_UNKNOWN_S = 2
# No restart time is known when the engine is down; a few seconds keeps clients from hammering.
ENGINE_DOWN_RETRY_S = 5
REASON_DRAINING = protocol.REJECT_DRAINING
PROMPT_TOO_LONG = "prompt_too_long"  # over --max-prompt-tokens, however large the context


@dataclass(frozen=True)
class Limits:
    """Fixed facts of one engine incarnation, from its ``HelloAck``."""

    max_queue: int
    n_ctx: int  # one slot's cells: the most a request may fill
    slots: int = 0


@dataclass(frozen=True)
class Load:
    """The node's load right now: the engine's board figures plus every frontend's pending
    requests (sent to the engine, not yet accepted or finished)."""

    waiting: int
    running: int
    drain_rate: float  # requests leaving the engine per second of work (engine/drain.py)
    pending_requests: int = 0
    draining: bool = False


# Stand-in when the board cannot be read: nothing known to be queued, no drain rate.
IDLE_LOAD = Load(waiting=0, running=0, drain_rate=0.0)


@dataclass(frozen=True)
class Rejection:
    """Why a request is turned away: ``status`` 400 (never fits) or 503 (try again later)."""

    status: int
    reason: str
    message: str
    retry_after: int | None = None  # a 503's


def retry_after_s(requests_ahead: int, drain_rate: float) -> int:
    """Seconds until ``requests_ahead`` requests have left at the engine's ``drain_rate``."""
    if drain_rate <= 0:
        return RETRY_UNKNOWN_S
    seconds = max(requests_ahead, 1) / drain_rate
    # Compare before ceil(): a tiny rate gives inf, which has no integer ceiling.
    if seconds >= RETRY_MAX_S:
        return RETRY_MAX_S
    return max(math.ceil(seconds), RETRY_MIN_S)


def admit(
    prompt_tokens: int,
    max_tokens: int,
    limits: Limits,
    load: Load,
    max_prompt_tokens: int = 0,
) -> Rejection | None:
    """``None`` when the request may be sent to the engine, else why not. ``max_prompt_tokens``
    is this frontend's ``--max-prompt-tokens`` (0: no limit of its own)."""
    never = _never_fits(prompt_tokens, max_tokens, limits, max_prompt_tokens)
    if never is not None:
        return never
    if load.draining:
        return _draining(load)
    # A request waits in the engine's queue unless a free slot takes it at the next tick:
    # the queue's bound is what turns it away.
    free_slots = max(limits.slots - load.running, 0)
    waiting = load.waiting + load.pending_requests
    if not capacity.queue_full(waiting, free_slots, limits.max_queue):
        return None
    queued = capacity.queued(waiting, free_slots)
    # Retry once the queue ahead has drained, not once one place in it is free: accepted
    # sooner, the request would wait behind those anyway, and every client refused in the
    # same burst comes back at that moment to find the queue full again (the openai client
    # gives up after two retries: bench/retry_after.py --max-tokens 8).
    return Rejection(
        503,
        protocol.REJECT_QUEUE_FULL,
        f"{queued} requests are queued (limit {limits.max_queue})",
        retry_after_s(queued, load.drain_rate),
    )


def _never_fits(
    prompt_tokens: int, max_tokens: int, limits: Limits, max_prompt_tokens: int
) -> Rejection | None:
    """The 400s, checked in this order: each names the limit the request is over."""
    if max_prompt_tokens and prompt_tokens > max_prompt_tokens:
        return Rejection(
            400,
            PROMPT_TOO_LONG,
            f"the prompt has {prompt_tokens} tokens; this server accepts at most "
            f"{max_prompt_tokens} (max_prompt_tokens)",
        )
    if not capacity.fits_context(prompt_tokens, max_tokens, limits.n_ctx):
        message = (
            f"prompt_tokens ({prompt_tokens}) + max_tokens ({max_tokens}) exceeds "
            f"the context length ({limits.n_ctx})"
        )
        return Rejection(400, protocol.REJECT_TOO_LONG, message)
    return None


def engine_rejection(detail: str, load: Load) -> Rejection:
    """The reply for a request the engine itself rejected (``finish_reason == "rejected"``)."""
    if detail == protocol.REJECT_TOO_LONG:
        return Rejection(400, detail, "request can never fit a slot's context")
    if detail == REASON_DRAINING:
        return _draining(load)
    ahead = load.waiting + load.pending_requests + 1
    reason = detail or protocol.REJECT_QUEUE_FULL
    return Rejection(
        503, reason, f"engine rejected the request: {reason}", retry_after_s(ahead, load.drain_rate)
    )


def _draining(load: Load) -> Rejection:
    # The engine finishes what it has, then goes away: everything it holds is ahead of us.
    ahead = load.waiting + load.running
    return Rejection(
        503, REASON_DRAINING, "engine is draining", retry_after_s(ahead, load.drain_rate)
    )
