"""Scheduling policies: each one answers "which waiting request gets the next free slot?".

Continuous batching advances every running sequence every tick whatever the policy; the only
lever a policy has is the order in which waiting requests are admitted into free slots.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from typing import Protocol

from tinyserve.engine.sequence import Sequence


class Policy(Protocol):
    """The interface every policy implements. The core never looks inside a policy."""

    name: str

    def add(self, seq: Sequence) -> None:
        """A request was accepted and now waits for a slot."""

    def remove(self, seq: Sequence) -> None:
        """A waiting request left early (cancelled, timed out)."""

    def pop_next(self) -> Sequence | None:
        """The waiting request to admit into a free slot now, or None if none waits."""

    def charge(self, seq: Sequence, tokens: int) -> None:
        """``seq`` had ``tokens`` tokens processed this tick (prefilled or generated)."""

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator[Sequence]: ...


class FifoPolicy:
    """Arrival order at the engine."""

    name = "fifo"

    def __init__(self) -> None:
        self._heap: list[tuple[int, Sequence]] = []
        self._removed: set[int] = set()

    def add(self, seq: Sequence) -> None:
        heapq.heappush(self._heap, (seq.order, seq))

    def remove(self, seq: Sequence) -> None:
        self._removed.add(seq.order)

    def pop_next(self) -> Sequence | None:
        while self._heap:
            _, seq = heapq.heappop(self._heap)
            if seq.order not in self._removed:
                return seq
            self._removed.discard(seq.order)
        return None

    def charge(self, seq: Sequence, tokens: int) -> None:
        """FIFO ignores service received."""

    def __len__(self) -> int:
        return len(self._heap) - len(self._removed)

    def __iter__(self) -> Iterator[Sequence]:
        return (seq for _, seq in self._heap if seq.order not in self._removed)


def make_policy(name: str) -> Policy:
    """The policy named by ``--policy``."""
    if name == FifoPolicy.name:
        return FifoPolicy()
    raise ValueError(f"unknown scheduling policy {name!r}")
