"""Each policy through the one interface the core uses: add, pop_next, charge, remove."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tinyserve.engine.request.sequence import Sequence, SequenceStatus
from tinyserve.engine.scheduling.policies import Policy, make_policy
from tinyserve.engine.scheduling.srpt import SrptPolicy, work
from tinyserve.engine.scheduling.wfq import WfqPolicy
from tinyserve.protocol import SamplingParams, Submit

_order = itertools.count(1)
MS = 1_000_000
POLICIES = ["fifo", "priority", "wfq", "deadline", "srpt"]


def seq(
    tenant: str = "default",
    priority: int = 0,
    tokens: int = 100,
    *,
    prompt: int = 10,
    arrival_ns: int = 0,
    deadline_ms: int = 0,
) -> Sequence:
    n = next(_order)
    request = Submit(
        f"r{n}",
        "f" * 32,
        [1] * prompt,
        SamplingParams(),
        tokens,
        priority,
        tenant,
        arrival_ns=arrival_ns,
        deadline_ms=deadline_ms,
    )
    return Sequence(request, order=n, status=SequenceStatus.WAITING)  # as the scheduler accepts it


def admit(policy: Policy) -> Sequence | None:
    s = policy.pop_next()
    if s is not None:
        s.status = SequenceStatus.DECODE  # what the core does when it grants the slot
    return s


def finish(policy: Policy, s: Sequence) -> None:
    policy.remove(s)
    s.status = SequenceStatus.FINISHED


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
    assert len(policy) == 1 and low.status is SequenceStatus.WAITING


@pytest.mark.parametrize("name", POLICIES)
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


# -- deadline ---------------------------------------------------------------------------------


def test_deadline_admits_earliest_due_time_first() -> None:
    policy = make_policy("deadline")
    # Due at 0+900, 100+200=300, 200+500=700 and 300+300=600 ms; one without a deadline.
    late = seq(arrival_ns=0, deadline_ms=900)
    none = seq(arrival_ns=50 * MS)
    soon = seq(arrival_ns=100 * MS, deadline_ms=200)
    mid = seq(arrival_ns=200 * MS, deadline_ms=500)
    later_but_sooner = seq(arrival_ns=300 * MS, deadline_ms=300)
    for s in (late, none, soon, mid, later_but_sooner):
        policy.add(s)
    order = [admit(policy) for _ in range(5)]
    assert order == [soon, later_but_sooner, mid, late, none]
    assert policy.rule(soon) == "deadline deadline_ms=200"
    assert policy.rule(none) == "deadline none"


def test_deadline_requests_without_one_keep_arrival_order() -> None:
    policy = make_policy("deadline")
    seqs = [seq(arrival_ns=i * MS) for i in range(5)]
    for s in reversed(seqs[:2]):
        policy.add(s)  # added out of order: the engine's arrival order (``order``) counts
    for s in seqs[2:]:
        policy.add(s)
    assert [admit(policy) for _ in seqs] == seqs


@given(st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 5_000)), min_size=1))
def test_deadline_order_is_sorted_by_due_time(requests: list[tuple[int, int]]) -> None:
    policy = make_policy("deadline")
    for arrival_ms, deadline_ms in requests:
        policy.add(seq(arrival_ns=arrival_ms * MS, deadline_ms=deadline_ms))
    admitted = [admit(policy) for _ in requests]
    due = [
        (0, s.request.arrival_ns + s.request.deadline_ms * MS) if s.request.deadline_ms else (1, 0)
        for s in admitted
        if s is not None
    ]
    assert due == sorted(due) and len(due) == len(requests)


# -- srpt -------------------------------------------------------------------------------------


def test_srpt_without_aging_admits_smallest_work_first() -> None:
    policy = make_policy("srpt", srpt_aging=0)
    big, small, medium = seq(tokens=500), seq(tokens=10), seq(tokens=100, prompt=40)
    for s in (big, small, medium):
        policy.add(s)
    assert [admit(policy) for _ in range(3)] == [small, medium, big]
    assert policy.rule(small) == f"shortest work={10 + 10} aging=0"


def test_srpt_work_leaves_out_the_cached_prefix() -> None:
    cached = seq(tokens=50, prompt=200)
    cached.cache_hint = 160
    assert work(cached) == 200 - 160 + 50
    policy = make_policy("srpt", srpt_aging=0)
    uncached = seq(tokens=50, prompt=100)
    policy.add(uncached)
    policy.add(cached)
    assert admit(policy) is cached


def test_srpt_without_aging_starves_a_long_request() -> None:
    policy = make_policy("srpt", srpt_aging=0)
    long = seq(tokens=1000)
    policy.add(long)
    for _ in range(100):  # one slot; a short request arrives each time it frees
        policy.add(seq(tokens=5))
        assert admit(policy) is not long
    assert long.status is SequenceStatus.WAITING


@settings(deadline=None)  # a busy machine; at most a few thousand arrivals per example
@given(
    work_tokens=st.integers(1, 4000),
    aging=st.floats(20, 1000),
    short=st.integers(1, 50),
    gap_ms=st.integers(100, 2000),
)
def test_srpt_aging_bounds_how_long_a_long_request_waits(
    work_tokens: int, aging: float, short: int, gap_ms: int
) -> None:
    """A steady stream of short requests, one slot freeing per arrival: the long request
    (arrived at 0) is admitted before any short one that arrived after work / aging s."""
    policy = SrptPolicy(aging)
    long = seq(tokens=work_tokens, prompt=0)
    policy.add(long)
    bound_ns = work_tokens / aging * 1e9
    for i in range(1, int(bound_ns / (gap_ms * MS)) + 2):
        policy.add(seq(tokens=short, prompt=0, arrival_ns=i * gap_ms * MS))
        chosen = admit(policy)
        if chosen is long:
            return
        assert chosen is not None and chosen.request.arrival_ns <= bound_ns
    pytest.fail(f"the long request still waits after {bound_ns / 1e9:.1f} s of arrivals")


@given(st.lists(st.tuples(st.integers(0, 60_000), st.integers(1, 3000)), min_size=1))
def test_srpt_order_is_arrival_plus_aged_work(requests: list[tuple[int, int]]) -> None:
    aging = 100.0
    policy = SrptPolicy(aging)
    for arrival_ms, tokens in requests:
        policy.add(seq(tokens=tokens, prompt=0, arrival_ns=arrival_ms * MS))
    admitted = [admit(policy) for _ in requests]
    keys = [s.request.arrival_ns / 1e9 + work(s) / aging for s in admitted if s is not None]
    assert len(keys) == len(requests)
    assert all(a <= b + 1e-9 for a, b in itertools.pairwise(keys))


def test_unknown_policy_and_negative_aging_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown scheduling policy"):
        make_policy("lottery")
    with pytest.raises(ValueError, match="aging"):
        make_policy("srpt", srpt_aging=-1)


def test_the_new_policies_are_chosen_by_flag_or_environment() -> None:
    from tinyserve.config import build_config
    from tinyserve.engine.scheduling.deadline import DeadlinePolicy
    from tinyserve.options import ENGINE

    config = build_config({}, environ={"TINYSERVE_POLICY": "srpt", "TINYSERVE_SRPT_AGING": "0"})
    policy = make_policy(config.policy, config.tenant_weight_map, config.srpt_aging)
    assert isinstance(policy, SrptPolicy) and policy.aging == 0
    config = build_config({"policy": "deadline"}, environ={}, role=ENGINE)
    assert isinstance(make_policy(config.policy), DeadlinePolicy)
    with pytest.raises(SystemExit):
        build_config({}, environ={"TINYSERVE_SRPT_AGING": "-1"}, role=ENGINE)
    with pytest.raises(SystemExit):
        build_config({}, environ={"TINYSERVE_POLICY": "lottery"}, role=ENGINE)
