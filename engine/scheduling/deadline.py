"""Earliest deadline first: the waiting request due soonest gets the next free slot.

A request's deadline is ``deadline_ms`` after its arrival at the frontend (``arrival_ns``, a
host-wide monotonic stamp, so every frontend's requests share one time line). Requests
without one go after every request that has one, in arrival order among themselves: they
wait while deadlined work keeps arriving, as low priorities do under ``priority``
(``--queue-timeout`` bounds that wait).

The policy only orders. Missing a deadline is the core's rule and holds under every policy: a
request still unfinished when its deadline passes ends then with ``deadline_missed`` (a
waiting one is never granted a slot; a running one keeps the tokens it already streamed).
"""

from __future__ import annotations

from tinyserve.engine.output.report import RULE_DEADLINE, Cause
from tinyserve.engine.request.sequence import Sequence, SequenceStatus
from tinyserve.engine.scheduling.heap_policy import HeapPolicy
from tinyserve.protocol import (
    FINISH_DEADLINE_MISSED,
    FINISH_QUEUE_TIMEOUT,
    FINISH_TIMEOUT,
    Submit,
)

_NS_PER_MS = 1_000_000


def due_ns(request: Submit) -> int | None:
    """When ``request`` must be finished (monotonic ns), or None if it has no deadline."""
    if not request.deadline_ms:
        return None
    return request.arrival_ns + request.deadline_ms * _NS_PER_MS


def overdue(seq: Sequence, now: int, queue_s: float, total_s: float) -> tuple[str, Cause] | None:
    """How ``seq`` ends at ``now`` if it is overdue: its deadline passed, or it waited
    longer than ``queue_s`` (``--queue-timeout``) or ran longer than ``total_s``
    (``--request-timeout``; 0: no such limit). None while it is not."""
    age = now - seq.request.arrival_ns
    due = due_ns(seq.request)
    if due is not None and now > due:
        return FINISH_DEADLINE_MISSED, Cause.DEADLINE
    if queue_s and seq.status is SequenceStatus.WAITING and age > queue_s * 1e9:
        return FINISH_QUEUE_TIMEOUT, Cause.QUEUE_TIMEOUT
    if total_s and age > total_s * 1e9:
        return FINISH_TIMEOUT, Cause.REQUEST_TIMEOUT
    return None


class DeadlinePolicy(HeapPolicy):
    """Smallest due time first; no deadline after all deadlines; arrival order breaks ties."""

    name = "deadline"
    rule_kind = RULE_DEADLINE

    def key(self, seq: Sequence) -> tuple[int, ...]:
        due = due_ns(seq.request)
        return (0, due, seq.order) if due is not None else (1, 0, seq.order)

    def rule(self, seq: Sequence) -> str:
        deadline = seq.request.deadline_ms
        if not deadline:
            return "deadline none"
        return f"deadline deadline_ms={deadline}"
