"""Every refusal of a request, decided here, one type per meaning:

- ``NeverFits`` (400): the request can never be served, however long the client waits: over
  ``--max-prompt-tokens`` or a slot's context;
- ``NotNow`` (503): the request is fine, the node cannot take it now, and its ``Retry-After``
  says when to come back: a full queue, a draining engine or frontend, no engine at all
  (``no_engine``, the one door that answers ``engine_unavailable``), or, on the OpenAI
  surfaces, a request that timed out waiting for a slot;
- ``Busy`` (429): this frontend holds as many requests as it may; another may have room.

Transport-free: the figures come in as plain values (read from the board and the handshake by
the caller). The engine re-checks on receipt and is authoritative; this check exists so that a
full node answers in microseconds instead of a round trip, with a useful ``Retry-After``.
"""

from __future__ import annotations

import math

from tinyserve import capacity, protocol
from tinyserve.frontend.link.board_view import IDLE_LOAD, Limits, NodeLoad
from tinyserve.frontend.link.engine_link import EngineLink
from tinyserve.frontend.link.streams import ENGINE_LOST
from tinyserve.frontend.models.errors import (
    CONTEXT_LENGTH_EXCEEDED,
    ENGINE_ERROR,
    MODEL_NOT_FOUND,
    SERVICE_UNAVAILABLE,
    TOO_MANY_REQUESTS,
    ApiError,
)
from tinyserve.protocol import HelloAck, RequestUpdate

RETRY_MIN_S = 1
RETRY_MAX_S = 60
# Retry-After while the engine knows no drain rate (engine/scheduling/drain.py: nothing has
# finished or run since it started): it has one within a step or two of having work, so come
# back soon for an estimate; one more 503 costs a client less than sleeping through an idle
# engine.
RETRY_UNKNOWN_S = 2
# No restart time is known when the engine is down; a few seconds keeps clients from hammering.
ENGINE_DOWN_RETRY_S = 5
# Another frontend of the node can take the request right away.
ELSEWHERE_RETRY_S = 1
REASON_DRAINING = protocol.REJECT_DRAINING
REASON_ENGINE_UNAVAILABLE = "engine_unavailable"
REASON_FRONTEND_BUSY = "frontend_busy"
PROMPT_TOO_LONG = "prompt_too_long"  # over --max-prompt-tokens, however large the context


class NeverFits(ApiError):
    """A 400 for a request that can never be served; ``param`` names its prompt's field,
    ``label`` is why, as the metrics and the admission figures say it."""

    def __init__(self, label: str, message: str, param: str) -> None:
        type_ = PROMPT_TOO_LONG if label == PROMPT_TOO_LONG else CONTEXT_LENGTH_EXCEEDED
        super().__init__(400, type_, message, param=param)
        self.label = label


class NotNow(ApiError):
    """A 503: the request was fine, the node cannot take it now; come back after
    ``retry_after`` seconds. ``label`` is its reason."""

    retry_after: int

    def __init__(self, reason: str, message: str, retry_after: int) -> None:
        super().__init__(503, SERVICE_UNAVAILABLE, message, reason=reason, retry_after=retry_after)
        self.label = reason


class Busy(ApiError):
    """A 429: the request was fine, this frontend is serving as many as it may."""

    def __init__(self, limit: int) -> None:
        message = f"this frontend is serving its limit of {limit} requests"
        super().__init__(
            429, TOO_MANY_REQUESTS, message, reason=REASON_FRONTEND_BUSY,
            retry_after=ELSEWHERE_RETRY_S,
        )  # fmt: skip


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
    load: NodeLoad,
    max_prompt_tokens: int = 0,
    prompt_field: str = "prompt",
) -> NeverFits | NotNow | None:
    """``None`` when the request may be sent to the engine, else its refusal.
    ``max_prompt_tokens`` is this frontend's ``--max-prompt-tokens`` (0: no limit of its
    own); ``prompt_field`` the request field that holds the prompt (a 400 names it)."""
    if max_prompt_tokens and prompt_tokens > max_prompt_tokens:
        message = (
            f"the prompt has {prompt_tokens} tokens; this server accepts at most "
            f"{max_prompt_tokens} (max_prompt_tokens)"
        )
        return NeverFits(PROMPT_TOO_LONG, message, prompt_field)
    if not capacity.fits_context(prompt_tokens, max_tokens, limits.n_ctx):
        return too_long(prompt_tokens, limits.n_ctx, prompt_field)
    if load.draining:
        return engine_draining(load)
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
    return NotNow(
        protocol.REJECT_QUEUE_FULL,
        f"{queued} requests are queued (limit {limits.max_queue})",
        retry_after_s(queued, load.drain_rate),
    )


def admit_embedding(limits: Limits, load: NodeLoad) -> NotNow | None:
    """``None`` when an embedding request may be sent to the engine, else its 503: the engine
    drains, or ``max_queue`` embedding requests already wait for their first part (a queue of
    their own: they take no slot, and wait only behind each other). Its ``Retry-After`` is
    the unknown rate's: the engine publishes no drain rate of embedding requests."""
    if load.draining:
        return engine_draining(load)
    if not capacity.queue_full(load.embed_waiting, 0, limits.max_queue):
        return None
    message = f"{load.embed_waiting} embedding requests are queued (limit {limits.max_queue})"
    return NotNow(protocol.REJECT_QUEUE_FULL, message, RETRY_UNKNOWN_S)


def fitted_max_tokens(prompt_tokens: int, max_tokens: int, n_ctx: int, limit: int) -> int:
    """``max_tokens`` as served: at most ``limit`` (``--max-tokens-limit``) and what a slot's
    ``n_ctx`` cells leave after the prompt (at least 1: a prompt that leaves none never fits)."""
    return min(max_tokens, limit, max(n_ctx - prompt_tokens, 1))


def too_long(prompt_tokens: int, n_ctx: int, prompt_field: str) -> NeverFits:
    """The 400 of a prompt that leaves no room in a slot's context for one token: worded as
    Anthropic's ("prompt is too long", which Claude Code acts on by compacting) and OpenAI's
    (``context_length_exceeded``, the model's maximum context length), so clients of either
    recognise it."""
    message = (
        f"prompt is too long: {prompt_tokens} tokens > {n_ctx - 1} maximum (this model's "
        f"maximum context length is {n_ctx} tokens, the prompt and at least one output token)"
    )
    return NeverFits(protocol.REJECT_TOO_LONG, message, prompt_field)


def engine_refusal(detail: str, load: NodeLoad, prompt_field: str = "prompt") -> NeverFits | NotNow:
    """The reply for a request the engine itself rejected (``finish_reason == "rejected"``)."""
    if detail == protocol.REJECT_TOO_LONG:
        message = "request can never fit a slot's context"
        return NeverFits(protocol.REJECT_TOO_LONG, message, prompt_field)
    if detail == REASON_DRAINING:
        return engine_draining(load)
    ahead = load.waiting + load.pending_requests + 1
    reason = detail or protocol.REJECT_QUEUE_FULL
    message = f"engine rejected the request: {reason}"
    return NotNow(reason, message, retry_after_s(ahead, load.drain_rate))


def engine_draining(load: NodeLoad) -> NotNow:
    """The engine finishes what it has, then goes away: everything it holds is ahead."""
    ahead = load.waiting + load.running
    return NotNow(REASON_DRAINING, "engine is draining", retry_after_s(ahead, load.drain_rate))


def frontend_draining() -> NotNow:
    """This frontend is shutting down; another one takes the request at once."""
    return NotNow(REASON_DRAINING, "frontend is shutting down", ELSEWHERE_RETRY_S)


def no_engine(detail: str = "engine unavailable") -> NotNow:
    """No engine serves this frontend now (not started, died, restarting)."""
    return NotNow(REASON_ENGINE_UNAVAILABLE, detail, ENGINE_DOWN_RETRY_S)


def model_of(ack: HelloAck | None, aliases: tuple[str, ...], asked: str) -> str:
    """The id of the model that serves a request naming ``asked``, which the reply names. A
    node serves one model and answers to any id a client sends (agents ask for their vendor's
    names, one for the main loop and another for background tasks), unless ``--model-alias``
    closes the list: then an id that is neither the model's nor an alias is a 404. Without the
    engine's word (``ack`` None) ``asked`` stands: the pipeline answers the 503."""
    if ack is None:
        return asked
    served = ack.model_name
    if aliases and asked != served and asked not in aliases:
        message = f"model {asked!r} does not exist; this server serves {served!r}"
        raise ApiError(404, MODEL_NOT_FOUND, message, param="model")
    return served


def serving(link: EngineLink) -> HelloAck:
    """The facts of the engine serving this frontend, or ``no_engine``."""
    ack = link.ack
    if ack is None:
        raise no_engine()
    return ack


def ending_error(
    end: RequestUpdate,
    load: NodeLoad | None,
    prompt_field: str = "prompt",
    *,
    queue_timeout_refused: bool = False,
) -> ApiError | None:
    """The HTTP error an ending maps to, or None for a normal one: a rejection, a lost
    engine, an engine error; with ``queue_timeout_refused`` (the OpenAI surfaces) a request
    that timed out waiting for a slot is a 503 too."""
    reason, load = end.finish_reason, load or IDLE_LOAD
    if reason == protocol.FINISH_REJECTED:
        return engine_refusal(end.detail, load, prompt_field)
    if reason == ENGINE_LOST:
        return no_engine(end.detail)
    if reason == protocol.FINISH_ERROR:
        return ApiError(500, ENGINE_ERROR, end.detail or "engine error")
    if reason == protocol.FINISH_QUEUE_TIMEOUT and queue_timeout_refused:
        message = "the request timed out waiting for a free slot"
        ahead = load.waiting + load.pending_requests + 1
        return NotNow(reason, message, retry_after_s(ahead, load.drain_rate))
    return None
