"""Each policy through the one interface the core uses: add, pop_next, charge, remove."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest

from tinyserve.engine.policies import Policy, make_policy
from tinyserve.engine.sequence import Sequence, Status
from tinyserve.engine.wfq import WfqPolicy
from tinyserve.protocol import SamplingParams, Submit

_order = itertools.count(1)


def seq(tenant: str = "default", priority: int = 0, tokens: int = 100) -> Sequence:
    n = next(_order)
    request = Submit(f"r{n}", "f" * 32, [1] * 10, SamplingParams(), tokens, priority, tenant)
    return Sequence(request, [], n)


def admit(policy: Policy) -> Sequence | None:
    s = policy.pop_next()
    if s is not None:
        s.status = Status.DECODE  # what the core does when it grants the slot
    return s


def finish(policy: Policy, s: Sequence) -> None:
    policy.remove(s)
    s.status = Status.FINISHED


def test_fifo_admits_in_arrival_order() -> None:
    policy = make_policy("fifo")
    seqs = [seq(priority=p) for p in (0, 5, -3, 9)]
    for s in seqs:
        policy.add(s)
    assert [admit(policy) for _ in seqs] == seqs
    assert admit(policy) is None and len(policy) == 0


def test_priority_admits_most_important_first_then_arrival() -> None:
    policy = make_policy("priority")
    seqs = [seq(priority=p) for p in (0, 5, 5, -3, 9)]
    for s in seqs:
        policy.add(s)
    admitted = [admit(policy) for _ in seqs]
    assert [s.request.priority for s in admitted if s] == [9, 5, 5, 0, -3]
    assert admitted[1] is seqs[1] and admitted[2] is seqs[2]


def test_priority_starves_low_priority_while_high_keeps_coming() -> None:
    policy = make_policy("priority")
    low = seq(priority=-5)
    policy.add(low)
    for _ in range(50):  # one slot; a new high-priority request arrives each time it frees
        policy.add(seq(priority=5))
        assert admit(policy) is not low
    assert len(policy) == 1 and low.status is Status.WAITING


@pytest.mark.parametrize("name", ["fifo", "priority", "wfq"])
def test_removed_waiting_requests_are_never_admitted(name: str) -> None:
    policy = make_policy(name)
    a, b, c = seq(), seq(), seq()
    for s in (a, b, c):
        policy.add(s)
    finish(policy, b)
    assert len(policy) == 2
    assert [admit(policy), admit(policy), admit(policy)] == [a, c, None]


def simulate(
    policy: Policy, load: dict[str, int], slots: int, ticks: int, tokens_per_request: int = 40
) -> Counter[str]:
    """Saturated engine: each tenant keeps ``load[t]`` requests waiting; every running request
    is charged one token per tick; a request ends after ``tokens_per_request`` tokens."""
    served: Counter[str] = Counter()
    running: dict[Sequence, int] = {}
    for _ in range(ticks):
        for tenant, backlog in load.items():
            while sum(1 for s in policy if s.request.tenant == tenant) < backlog:
                policy.add(seq(tenant))
        while len(running) < slots and (s := admit(policy)) is not None:
            running[s] = 0
        for s in list(running):
            policy.charge(s, 1)
            served[s.request.tenant] += 1
            running[s] += 1
            if running[s] == tokens_per_request:
                del running[s]
                finish(policy, s)
    return served


def test_wfq_token_share_follows_weights_under_saturation() -> None:
    policy = make_policy("wfq", {"a": 3.0, "b": 1.0})
    served = simulate(policy, {"a": 8, "b": 8}, slots=8, ticks=4000)
    share = served["a"] / (served["a"] + served["b"])
    assert abs(share - 0.75) <= 0.075, served


def test_wfq_charges_tokens_not_admissions() -> None:
    # Tenant a sends requests 4x as long as b's; equal weights must still mean equal tokens.
    policy = WfqPolicy()
    served: Counter[str] = Counter()
    running: dict[Sequence, int] = {}
    length = {"a": 160, "b": 40}
    for _ in range(6000):
        for tenant in ("a", "b"):
            if not any(s.request.tenant == tenant for s in policy):
                policy.add(seq(tenant))
        while len(running) < 4 and (s := admit(policy)) is not None:
            running[s] = 0
        for s in list(running):
            policy.charge(s, 1)
            served[s.request.tenant] += 1
            running[s] += 1
            if running[s] == length[s.request.tenant]:
                del running[s]
                finish(policy, s)
    assert abs(served["a"] / sum(served.values()) - 0.5) <= 0.05, served


def test_wfq_tenant_back_from_idle_gets_no_burst() -> None:
    policy = make_policy("wfq")
    simulate(policy, {"a": 8}, slots=8, ticks=3000)  # b idle meanwhile: a alone
    after = simulate(policy, {"a": 8, "b": 8}, slots=8, ticks=1000)
    share_b = after["b"] / (after["a"] + after["b"])
    assert share_b <= 0.55, after  # its fair half, not a burst to pay back the idle time


def test_wfq_forgets_idle_tenants() -> None:
    policy = WfqPolicy()
    for i in range(200):
        s = seq(f"tenant-{i}")
        policy.add(s)
        s = admit(policy)
        assert s is not None
        policy.charge(s, 5)
        finish(policy, s)
    assert policy.tenants == 0
