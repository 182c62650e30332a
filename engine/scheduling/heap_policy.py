"""Policies that admit waiting requests in the order of a key fixed at acceptance: a heap.

``FifoPolicy`` (arrival) and ``PriorityPolicy`` (larger priority first) here; the deadline
and SRPT policies (``deadline.py``, ``srpt.py``) are keyed heaps too.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator

from tinyserve.engine.output.report import RULE_ARRIVAL, RULE_PRIORITY
from tinyserve.engine.request.sequence import Sequence, SequenceStatus


class HeapPolicy:
    """Admits the waiting request with the smallest ``key``; subclasses choose the key.

    Requests that leave while waiting stay in the heap and are skipped when they surface
    (their status is no longer WAITING), so ``remove`` is O(1).
    """

    name = "heap"
    rule_kind = RULE_ARRIVAL

    def __init__(self) -> None:
        self._heap: list[tuple[tuple[int, ...], Sequence]] = []
        self._waiting = 0

    def key(self, seq: Sequence) -> tuple[int, ...]:
        raise NotImplementedError

    def rule(self, seq: Sequence) -> str:
        raise NotImplementedError

    def add(self, seq: Sequence) -> None:
        heapq.heappush(self._heap, (self.key(seq), seq))
        self._waiting += 1

    def pop_next(self) -> Sequence | None:
        while self._heap:
            _, seq = heapq.heappop(self._heap)
            if seq.status is SequenceStatus.WAITING:
                self._waiting -= 1
                return seq
        return None

    def charge(self, seq: Sequence, tokens: int) -> None:
        """Order does not depend on service received."""

    def remove(self, seq: Sequence) -> None:
        if seq.status is SequenceStatus.WAITING:
            self._waiting -= 1

    def __len__(self) -> int:
        return self._waiting

    def __iter__(self) -> Iterator[Sequence]:
        return (seq for _, seq in self._heap if seq.status is SequenceStatus.WAITING)


class FifoPolicy(HeapPolicy):
    """Arrival order at the engine."""

    name = "fifo"

    def key(self, seq: Sequence) -> tuple[int, ...]:
        return (seq.order,)

    def rule(self, seq: Sequence) -> str:
        return "arrival"


class PriorityPolicy(HeapPolicy):
    """Larger ``priority`` first, arrival order among equals.

    Strict: while higher-priority requests keep arriving, lower ones wait indefinitely
    (only ``--queue-timeout`` ends their wait). That starvation is the price of the policy.
    """

    name = "priority"
    rule_kind = RULE_PRIORITY

    def key(self, seq: Sequence) -> tuple[int, ...]:
        return (-seq.request.priority, seq.order)

    def rule(self, seq: Sequence) -> str:
        return f"priority={seq.request.priority}"
