"""Scheduling policies: each one answers "which waiting request gets the next free slot?".

Continuous batching advances every running sequence every tick whatever the policy; the only
lever a policy has is the order in which waiting requests are admitted into free slots.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from typing import Protocol

from tinyserve.engine.report import RULE_ARRIVAL, RULE_PRIORITY
from tinyserve.engine.sequence import Sequence, Status

PRIORITY_MIN, PRIORITY_MAX, PRIORITY_DEFAULT = -10, 10, 0


class Policy(Protocol):
    """The interface every policy implements. The core never looks inside a policy."""

    name: str
    rule_kind: str  # how it chooses, for slot grants: one of report.RULE_*

    def add(self, seq: Sequence) -> None:
        """A request was accepted and now waits for a slot."""

    def pop_next(self) -> Sequence | None:
        """The waiting request to admit into a free slot now, or None if none waits."""

    def rule(self, seq: Sequence) -> str:
        """Why ``seq`` was chosen; called right after ``pop_next`` returned it. The first word
        is the rule itself ("arrival", "priority=3", "tenant=a"), bounded so metrics can
        label by it; any further words are the figures behind it (WFQ's virtual time)."""

    def charge(self, seq: Sequence, tokens: int) -> None:
        """``seq`` had ``tokens`` tokens processed this tick (prefilled or generated)."""

    def remove(self, seq: Sequence) -> None:
        """``seq`` ended (waiting or running); called before its status becomes FINISHED."""

    def __len__(self) -> int:
        """Requests waiting for a slot."""

    def __iter__(self) -> Iterator[Sequence]:
        """The waiting requests, in no particular order."""


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
            if seq.status is Status.WAITING:
                self._waiting -= 1
                return seq
        return None

    def charge(self, seq: Sequence, tokens: int) -> None:
        """Order does not depend on service received."""

    def remove(self, seq: Sequence) -> None:
        if seq.status is Status.WAITING:
            self._waiting -= 1

    def __len__(self) -> int:
        return self._waiting

    def __iter__(self) -> Iterator[Sequence]:
        return (seq for _, seq in self._heap if seq.status is Status.WAITING)


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


def make_policy(
    name: str, weights: dict[str, float] | None = None, srpt_aging: float | None = None
) -> Policy:
    """The policy named by ``--policy``; ``weights`` are WFQ's tenant weights, ``srpt_aging``
    SRPT's tokens forgiven per second waited (None: its default)."""
    from tinyserve.engine.deadline import DeadlinePolicy
    from tinyserve.engine.srpt import DEFAULT_AGING, SrptPolicy
    from tinyserve.engine.wfq import WfqPolicy

    if name == "wfq":
        return WfqPolicy(weights)
    if name == "srpt":
        return SrptPolicy(DEFAULT_AGING if srpt_aging is None else srpt_aging)
    policies: dict[str, type[HeapPolicy]] = {
        "fifo": FifoPolicy,
        "priority": PriorityPolicy,
        "deadline": DeadlinePolicy,
    }
    if name not in policies:
        raise ValueError(f"unknown scheduling policy {name!r}")
    return policies[name]()
