"""Prompt log-probabilities (``Submit.prompt_logprobs``): what a chunk's logits say about the
prompt's own next tokens.

A request that wants them prefills with logits on every row (``add_span(logits_all=True)``),
and never from the prefix cache: cached positions were computed without logits, so they are
prefilled again (``Timeline.prefix_recomputed``). Row ``i`` of a chunk that starts at
position ``p`` scores prompt token ``p + i + 1``; the last row of the prompt's last chunk
scores no prompt token (it is where the first generated token is sampled from). Its
chunks are never cut short by other requests' rows (``defers``).
"""

from __future__ import annotations

from typing import Any

from tinyserve.engine.request.sequence import Sequence
from tinyserve.engine.runtime.runtime import LlamaRuntime


def wanted(seq: Sequence) -> bool:
    return seq.request.prompt_logprobs >= 0


def defers(seq: Sequence, n: int, piece: int, room: int) -> bool:
    """Whether ``seq`` waits for a later tick rather than prefill only ``n`` tokens of its
    next ``piece`` now.

    NOTE: how a prompt is split across decode calls moves its logits (by up to 0.08 in a
    token's logprob measured here), so a request that wants them takes each piece whole:
    its numbers then depend on ``--chunk`` alone, not on what else shared the tick. It only
    waits for a piece that fits a batch beside every slot's decode row (``room``), so it is
    never starved.
    """
    return wanted(seq) and n < piece <= room


def chunk_entries(
    runtime: LlamaRuntime, seq: Sequence, last_row: int, n_tokens: int
) -> list[list[Any]]:
    """Entries for the prompt tokens the chunk just decoded predicts; call before ``n_past``
    moves past it. ``last_row`` is the chunk's last batch row; every row had logits."""
    start = seq.n_past  # position of the chunk's first token
    targets = seq.request.prompt_ids[start + 1 : start + 1 + n_tokens]
    if not targets:
        return []
    first_row = last_row - n_tokens + 1
    return runtime.logprobs_rows(first_row, targets, seq.request.prompt_logprobs)
