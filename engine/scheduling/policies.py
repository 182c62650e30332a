"""Scheduling policies: each one answers "which waiting request gets the next free slot?".

Continuous batching advances every running sequence every tick whatever the policy; the only
lever a policy has is the order in which waiting requests are admitted into free slots.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from tinyserve.engine.request.sequence import Sequence
from tinyserve.engine.scheduling.deadline import DeadlinePolicy
from tinyserve.engine.scheduling.heap_policy import FifoPolicy, HeapPolicy, PriorityPolicy
from tinyserve.engine.scheduling.srpt import DEFAULT_AGING, SrptPolicy
from tinyserve.engine.scheduling.wfq import WfqPolicy


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


def make_policy(
    name: str, weights: dict[str, float] | None = None, srpt_aging: float | None = None
) -> Policy:
    """The policy named by ``--policy``; ``weights`` are WFQ's tenant weights, ``srpt_aging``
    SRPT's tokens forgiven per second waited (None: its default)."""
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
