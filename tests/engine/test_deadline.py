"""Deadlines inside the core, with the real model and a clock the test moves: a request past
its deadline ends ``deadline_missed`` (waiting: no slot, no token; running: the tokens it
made), its slot freed, under any policy; the deadline policy grants the earliest deadline
first."""

from __future__ import annotations

import pytest

from tinyserve import protocol as p
from tinyserve.engine.core import EngineCore
from tinyserve.engine.output.report import Cause
from tinyserve.engine.runtime.runtime import LlamaRuntime

from .conftest import core_config
from .test_core import FRONTEND, PROMPT, Driver

MS = 1_000_000


class Clock:
    """Monotonic ns that only move when the test says (arrivals are at 0)."""

    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        return self.now


def submit(d: Driver, rid: str, max_tokens: int, deadline_ms: int = 0) -> str:
    request = p.Submit(rid, FRONTEND, PROMPT, p.SamplingParams(ignore_eos=True), max_tokens,
                       arrival_ns=0, deadline_ms=deadline_ms)  # fmt: skip
    d.core.submit(request)
    return rid


@pytest.mark.parametrize("policy", ["fifo", "deadline"])
def test_requests_past_their_deadline_end_deadline_missed(
    runtime: LlamaRuntime, policy: str
) -> None:
    clock = Clock()
    d = Driver(EngineCore(core_config(slots=1, policy=policy), runtime, clock))
    running = submit(d, "running", 400, deadline_ms=1000)
    d.step()  # it holds the only slot from here
    waiting = submit(d, "waiting", 4, deadline_ms=500)
    for _ in range(50):
        d.step()
        if len(d.tokens(running)) >= 3:
            break
    clock.now = 400 * MS
    d.step()
    assert not d.finishes  # before both deadlines nothing ends
    clock.now = 700 * MS
    d.step()
    assert d.final(waiting).finish_reason == p.FINISH_DEADLINE_MISSED
    assert running not in d.finishes
    clock.now = 1001 * MS
    d.step()
    made = len(d.tokens(running))
    for rid in (running, waiting):
        assert d.final(rid).finish_reason == p.FINISH_DEADLINE_MISSED
        assert d.finishes[rid].cause is Cause.DEADLINE
    assert 3 <= made < 400
    assert d.tokens(waiting) == [] and d.finishes[waiting].timeline.slot is None
    load = d.core.load()
    assert (load.running, load.waiting, load.blocks_used) == (0, 0, 0) and not d.core.has_work()


def test_the_deadline_policy_grants_the_earliest_deadline_first(runtime: LlamaRuntime) -> None:
    d = Driver(EngineCore(core_config(slots=1, policy="deadline"), runtime, Clock()))
    submit(d, "holder", 3)
    d.step()
    for rid, deadline in (("none", 0), ("late", 600_000), ("soon", 60_000), ("mid", 300_000)):
        submit(d, rid, 2, deadline)
    d.run()
    granted = [g.request_id for g in d.grants]
    assert granted == ["holder", "soon", "mid", "late", "none"]
