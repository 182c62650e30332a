"""The capacity rule, written once: the engine's acceptance (``engine/core.py``) and the
frontend's admission (``frontend/request/admission.py``) both decide with these functions, so
the two cannot drift apart. Plain integers in, plain answers out."""

from __future__ import annotations


def blocks_needed(tokens: int, block_size: int) -> int:
    """KV blocks that ``tokens`` tokens occupy (a partial last block is a whole one)."""
    return -(-tokens // block_size)


def fits_blocks(tokens: int, block_size: int, blocks_total: int) -> bool:
    """Whether ``tokens`` tokens (a request's prompt plus all it may generate) fit in the KV
    cache at all, i.e. in an empty engine."""
    return blocks_needed(tokens, block_size) <= blocks_total


def fits_context(
    prompt_tokens: int, max_tokens: int, n_ctx: int, block_size: int, blocks_total: int
) -> bool:
    """Whether a request can ever run: a prompt, prompt + ``max_tokens`` within the context,
    and its worst-case blocks within the KV cache."""
    total = prompt_tokens + max_tokens
    return prompt_tokens > 0 and total <= n_ctx and fits_blocks(total, block_size, blocks_total)


def queued(waiting: int, free_slots: int, short_of_blocks: bool = False) -> int:
    """Requests that would wait in the queue: those that a free slot takes at the engine's
    next tick never do, unless the request is ``short_of_blocks`` (too few free and
    evictable KV blocks for it now): then it waits for them whatever the slots."""
    return max(waiting - (0 if short_of_blocks else free_slots), 0)


def queue_full(
    waiting: int, free_slots: int, max_queue: int, short_of_blocks: bool = False
) -> bool:
    """Whether one more request would find ``max_queue`` requests already queued."""
    return queued(waiting, free_slots, short_of_blocks) >= max_queue
