"""Shortest remaining work first, with ageing so that long requests cannot starve.

A request's work is the prompt tokens it still has to prefill (what the prefix cache held of
its prompt at acceptance is not counted) plus ``max_tokens``: the most it can cost. Without
preemption a request's remaining work changes only once it holds a slot, so among waiting
requests "shortest remaining" is "smallest work".

Ageing: each second of waiting forgives ``aging`` tokens of work. All waiting requests age at
the same rate, so ``work - aging * waited`` orders them as ``arrival + work / aging`` does,
a key fixed at arrival: the heap never needs re-sorting. It also gives the starvation bound:
a request that arrived at ``t`` with work ``W`` is admitted before any request that arrives
after ``t + W / aging``, so only the finitely many that arrive before then can overtake it.
``aging == 0`` is pure shortest-first, which starves long requests under a steady stream of
short ones.
"""

from __future__ import annotations

from tinyserve.engine.output.report import RULE_WORK
from tinyserve.engine.request.sequence import Sequence
from tinyserve.engine.scheduling.heap_policy import HeapPolicy

DEFAULT_AGING = 100.0  # tokens of work forgiven per second waited


def work(seq: Sequence) -> int:
    """Tokens ``seq`` may still cost: its uncached prompt plus its whole output budget."""
    return seq.prompt_len - seq.cache_hint + seq.request.max_tokens


class SrptPolicy(HeapPolicy):
    """Smallest ``arrival + work / aging`` first (smallest work when ``aging`` is 0)."""

    name = "srpt"
    rule_kind = RULE_WORK

    def __init__(self, aging: float = DEFAULT_AGING) -> None:
        super().__init__()
        if aging < 0:
            raise ValueError("srpt aging must be >= 0")
        self.aging = aging

    def key(self, seq: Sequence) -> tuple[int, ...]:
        if self.aging == 0:
            return (work(seq), seq.order)
        return (seq.request.arrival_ns + round(work(seq) * 1e9 / self.aging), seq.order)

    def rule(self, seq: Sequence) -> str:
        return f"shortest work={work(seq)} aging={self.aging:g}"
