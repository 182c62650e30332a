"""Per-request timelines recorded by the core (real model, no sockets) and policy rules."""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest

from tinyserve import protocol as p
from tinyserve.engine.core import EngineCore
from tinyserve.engine.request.timeline import Timeline
from tinyserve.engine.runtime.runtime import LlamaRuntime

from .conftest import core_config
from .test_core import FRONTEND, Driver

PROMPT = list(range(100, 140))  # 40 tokens: chunks of 32 and 8 with --chunk 32
ROUNDING_MS = 0.01  # every figure is rounded to the microsecond


def make(runtime: LlamaRuntime, **overrides: Any) -> Driver:
    return Driver(EngineCore(core_config(**overrides), runtime))


def timeline(driver: Driver, rid: str) -> dict[str, Any]:
    final = driver.final(rid)
    assert final.timeline is not None
    return final.timeline


def submit(
    driver: Driver, rid: str, max_tokens: int = 6, prompt: list[int] = PROMPT, **fields: Any
) -> str:
    driver.core.submit(
        p.Submit(
            rid,
            FRONTEND,
            prompt,
            p.SamplingParams(ignore_eos=True),
            max_tokens,
            arrival_ns=time.monotonic_ns(),
            **fields,
        )
    )
    return rid


def test_request_that_waited_explains_its_wait_chunks_and_decode(runtime: LlamaRuntime) -> None:
    driver = make(runtime, slots=1, policy="fifo", prefix_cache=False)
    first = submit(driver, "first", max_tokens=5)
    # Another prompt: nothing of it is in the slot "first" leaves.
    second = submit(driver, "second", 7, list(range(200, 240)), admission={"decision": "admitted"})
    driver.run()
    t = timeline(driver, second)
    assert t["status"] == "finished" and t["request_id"] == second
    assert t["admission"] == {"decision": "admitted"}
    assert t["queue"]["policy"] == "fifo" and t["queue"]["rule"] == "arrival"
    assert t["queue"]["ahead"] == 1  # "first" took the only slot before it
    assert (t["accepted"]["running"], t["accepted"]["waiting"]) == (0, 1)  # "first" waited
    first_end = timeline(driver, first)["finish"]
    assert t["slot"]["tick"] == first_end["tick"] + 1  # the slot freed by "first", next tick
    assert [c["tokens"] for c in t["prefill"]] == [32, 8]
    assert [c["tick"] for c in t["prefill"]] == [t["slot"]["tick"], t["slot"]["tick"] + 1]
    assert t["finish"]["reason"] == p.FINISH_LENGTH
    assert t["finish"]["generated_tokens"] == 7
    # The first token comes from the last prefill chunk; each later one is a decode tick.
    assert t["decode"]["ticks"] == 6
    assert t["decode"]["runs"] == [[t["prefill"][-1]["tick"] + 1, 6, 1, t["decode"]["ms"]]]
    # The steps add up: every interval runs from the end of the previous step.
    assert t["accepted"]["ms"] + t["queue"]["wait_ms"] == pytest.approx(
        t["slot"]["ms"], abs=ROUNDING_MS
    )
    prefill_ms = sum(c["ms"] for c in t["prefill"])
    assert t["slot"]["ms"] + prefill_ms == pytest.approx(t["first_token_ms"], abs=ROUNDING_MS)
    assert t["prefill"][-1]["end_ms"] == t["first_token_ms"]
    longest_tick = max(c["ms"] for c in t["prefill"])
    end_of_decode = t["first_token_ms"] + t["decode"]["ms"]
    assert 0 <= t["finish"]["ms"] - end_of_decode < longest_tick
    # The first request never waited and had nobody admitted ahead of it.
    assert timeline(driver, first)["queue"]["ahead"] == 0


def test_decode_ticks_are_compacted_by_batch_size(runtime: LlamaRuntime) -> None:
    driver = make(runtime, prefix_cache=False)
    short = submit(driver, "short", max_tokens=3)
    long = submit(driver, "long", max_tokens=9)
    driver.run()
    runs = timeline(driver, long)["decode"]["runs"]
    assert [run[2] for run in runs] == [2, 1]  # with "short", then alone
    assert sum(run[1] for run in runs) == 8
    assert runs[1][0] == runs[0][0] + runs[0][1]  # consecutive ticks
    assert timeline(driver, short)["decode"]["runs"][0][2] == 2


def test_priority_rule_is_in_the_slot_event_and_the_timeline(runtime: LlamaRuntime) -> None:
    driver = make(runtime, slots=1, policy="priority")
    submit(driver, "running", max_tokens=3)
    driver.step()  # "running" holds the slot
    low = submit(driver, "low", max_tokens=2, priority=-2)
    high = submit(driver, "high", max_tokens=2, priority=5)
    driver.run()
    assert timeline(driver, high)["queue"]["rule"] == "priority=5"
    assert timeline(driver, high)["queue"]["ahead"] == 0
    assert timeline(driver, low)["queue"]["rule"] == "priority=-2"
    assert timeline(driver, low)["queue"]["ahead"] == 1  # "high" went first
    grants = [(g.rule, g.priority) for g in driver.grants if g.request_id == high]
    assert grants == [("priority", 5)]


def test_wfq_rule_names_the_tenant_and_its_virtual_time(runtime: LlamaRuntime) -> None:
    driver = make(runtime, slots=1, policy="wfq")
    rid = submit(driver, "a1", max_tokens=2, tenant="team-a")
    driver.run()
    rule = timeline(driver, rid)["queue"]["rule"]
    assert rule.startswith("tenant=team-a vtime=") and rule.endswith("weight=1")
    grant = next(g for g in driver.grants if g.request_id == rid)
    assert (grant.rule, grant.tenant) == ("tenant", "team-a")


def test_prefix_reuse_and_rejection_are_recorded(runtime: LlamaRuntime) -> None:
    driver = make(runtime)
    submit(driver, "warm", max_tokens=2)
    driver.run()
    reuse = submit(driver, "reuse", max_tokens=2)
    driver.run()
    # All but its last token, kept in the slot "warm" left: nothing was written there.
    t = timeline(driver, reuse)
    assert (t["slot"]["index"], t["prefix_reused_tokens"]) == (0, len(PROMPT) - 1)
    assert [c["tokens"] for c in t["prefill"]] == [1] and "restore" not in t
    driver.core.submit(p.Submit("huge", FRONTEND, [1] * 2000, p.SamplingParams(), 8, arrival_ns=1))
    driver.step()
    rejected = timeline(driver, "huge")
    assert rejected["finish"]["reason"] == p.FINISH_REJECTED
    assert rejected["finish"]["detail"] == p.REJECT_TOO_LONG
    assert rejected["accepted"] is None and rejected["queue"] is None


def test_recent_timelines_are_bounded_and_live_ones_answer(runtime: LlamaRuntime) -> None:
    driver = make(runtime, timeline_keep=2, slots=1)
    for rid in ("t1", "t2", "t3"):
        submit(driver, rid, max_tokens=2)
    driver.step()
    assert (driver.core.timeline_of("t1") or {})["status"] == "running"
    assert (driver.core.timeline_of("t3") or {})["status"] == "waiting"
    driver.run()
    assert driver.core.timeline_of("t1") is None  # the oldest was dropped
    assert driver.core.timeline_of("t3") == timeline(driver, "t3")
    assert driver.core.timeline_of("never-seen") is None


def test_scheduling_decisions_are_logged_at_debug_level(
    runtime: LlamaRuntime, caplog: pytest.LogCaptureFixture
) -> None:
    driver = make(runtime, slots=1, policy="priority")
    submit(driver, "one", max_tokens=2)
    submit(driver, "two", max_tokens=2, priority=3)
    with caplog.at_level(logging.INFO, logger="tinyserve.engine.request.timeline"):
        driver.run()
    assert not [r for r in caplog.records if r.getMessage() == "slot granted"]  # off at info
    submit(driver, "three", max_tokens=2)
    submit(driver, "four", max_tokens=2, priority=3)
    with caplog.at_level(logging.DEBUG, logger="tinyserve.engine.request.timeline"):
        driver.run()
    grants = [r.fields for r in caplog.records if r.getMessage() == "slot granted"]
    assert [g["request_id"] for g in grants] == ["four", "three"]  # "four" has priority 3
    assert grants[0]["rule"] == "priority=3" and grants[0]["policy"] == "priority"
    assert grants[1]["ahead"] == 1 and grants[1]["waiting"] == 0
    assert {"slot", "waited_ms"} <= set(grants[0])


MS = 1_000_000


def recorded(stage: str) -> Timeline:
    """A timeline recorded by hand with round stamps, up to ``stage``."""
    request = p.Submit(
        "r1",
        FRONTEND,
        [1] * 30,
        p.SamplingParams(),
        8,
        arrival_ns=1_000 * MS,
        tenant="team-a",
        priority=2,
        admission={"decision": "admitted"},
    )
    t = Timeline(request, "wfq")
    if stage == "rejected":
        t.end(p.FINISH_REJECTED, p.REJECT_TOO_LONG, 3, 1_001 * MS, 0)
        return t
    t.accept(4, 1_002 * MS, 1, 3, 0)
    if stage == "waiting":
        return t
    t.grant(6, 1_010 * MS, 0, "tenant=team-a vtime=0 weight=1", 5)
    t.reused(12, "host", 3 * MS)  # written into its slot from host memory
    t.prefill_chunk(6, 4, 1_030 * MS, 7 * MS)
    t.prefill_chunk(7, 14, 1_045 * MS, 9 * MS)
    t.first_token(1_045 * MS)
    for tick, batch, now in [(8, 2, 1_060), (9, 2, 1_070), (10, 1, 1_075), (12, 1, 1_090)]:
        t.decode_tick(tick, batch, now * MS)
    t.end(p.FINISH_LENGTH, "", 12, 1_091 * MS, 5)
    return t


def test_the_wire_form_keeps_its_shape() -> None:
    """The whole shape, pinned: the frontend and docs/observability.md read these keys."""
    assert recorded("finished").to_dict() == {
        "request_id": "r1",
        "status": "finished",
        "tenant": "team-a",
        "priority": 2,
        "prompt_tokens": 30,
        "admission": {"decision": "admitted"},
        "accepted": {"tick": 4, "ms": 2.0, "running": 3, "waiting": 0},
        "queue": {
            "policy": "wfq",
            "wait_ms": 8.0,
            "ahead": 4,
            "rule": "tenant=team-a vtime=0 weight=1",
        },
        "slot": {"index": 0, "tick": 6, "ms": 10.0},
        "prefix_reused_tokens": 12,
        # 12 written from host memory, 4 + 14 prefilled by its chunks
        "prompt_from": {"slot": 0, "host": 12, "disk": 0, "leader": 0, "computed": 18},
        "prefill": [
            {"tick": 6, "tokens": 4, "ms": 20.0, "end_ms": 30.0, "decode_ms": 7.0},
            {"tick": 7, "tokens": 14, "ms": 15.0, "end_ms": 45.0, "decode_ms": 9.0},
        ],
        "first_token_ms": 45.0,
        "decode": {
            "ticks": 4,
            "ms": 45.0,
            "runs": [[8, 2, 2, 25.0], [10, 1, 1, 5.0], [12, 1, 1, 15.0]],
        },
        "finish": {
            "reason": "length",
            "detail": "",
            "tick": 12,
            "ms": 91.0,
            "generated_tokens": 5,
        },
        "restore": {"tier": "host", "tokens": 12, "ms": 3.0},
    }


def test_waiting_and_rejected_timelines_leave_later_steps_empty() -> None:
    waiting = recorded("waiting").to_dict()
    assert waiting["status"] == "waiting" and waiting["slot"] is None
    assert waiting["queue"] == {"policy": "wfq", "wait_ms": None, "ahead": None}
    assert waiting["decode"] == {"ticks": 0, "ms": 0.0, "runs": []}
    rejected = recorded("rejected").to_dict()
    assert (rejected["accepted"], rejected["queue"], rejected["first_token_ms"]) == (None,) * 3
    assert rejected["finish"]["detail"] == p.REJECT_TOO_LONG
