"""The capacity rule, written once: the engine's acceptance (``engine/scheduling/scheduler.py``)
and the frontend's admission (``frontend/request/admission.py``) both decide with these
functions, so the two cannot drift apart. Plain integers in, plain answers out.

Each slot has KV cells of its own, so a request competes for a slot and nothing else: it
fits if its prompt and its whole output fit one slot's cells, and it is turned away only
when the queue of requests waiting for a slot is full.
"""

from __future__ import annotations


def blocks_needed(tokens: int, block_size: int) -> int:
    """KV blocks that ``tokens`` tokens occupy (a partial last block is a whole one)."""
    return -(-tokens // block_size)


def fits_context(prompt_tokens: int, max_tokens: int, n_ctx: int) -> bool:
    """Whether a request can ever run: a prompt, and prompt + ``max_tokens`` within the
    ``n_ctx`` cells of one slot."""
    return prompt_tokens > 0 and prompt_tokens + max_tokens <= n_ctx


def queued(waiting: int, free_slots: int) -> int:
    """Requests that would wait in the queue: those that a free slot takes at the engine's
    next tick never do."""
    return max(waiting - free_slots, 0)


def queue_full(waiting: int, free_slots: int, max_queue: int) -> bool:
    """Whether one more request would find ``max_queue`` requests already queued."""
    return queued(waiting, free_slots) >= max_queue
