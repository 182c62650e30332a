"""The event feed: leases switch it on and off, ticks are folded into bounded-rate updates."""

from __future__ import annotations

from tinyserve.engine.output import events
from tinyserve.engine.output.events import EventFeed
from tinyserve.engine.output.report import (
    Batch,
    Cause,
    EmbedBatch,
    Ended,
    Grant,
    Load,
    Rejected,
    TickReport,
)
from tinyserve.engine.request.sequence import Sequence, SequenceStatus
from tinyserve.engine.request.timeline import Timeline
from tinyserve.protocol import (
    REJECT_QUEUE_FULL,
    FeedUpdate,
    RequestUpdate,
    SamplingParams,
    Submit,
    decode,
    encode,
)

MS = 1_000_000
LOAD = Load(tick=5, waiting=2, running=1, blocks_total=64, blocks_used=10, blocks_cached=4,
            drain_rate=0.0)  # fmt: skip


def submit(request_id: str, tenant: str = "a", priority: int = 0, prompt: int = 8) -> Submit:
    return Submit(request_id, "f" * 32, list(range(prompt)), SamplingParams(), 16,
                  priority=priority, tenant=tenant, arrival_ns=0)  # fmt: skip


def seq(request_id: str, status: SequenceStatus, **kw: object) -> Sequence:
    return Sequence(submit(request_id, **kw), status=status)  # type: ignore[arg-type]


def tick(tokens: int = 4, grants: int = 0, finishes: int = 0) -> TickReport:
    one_token = {"f" * 32: [RequestUpdate("d", 0, [7])]}  # generated: one token
    report = TickReport(LOAD, one_token, batch=Batch(2, tokens, tokens - 1, 1, 0.01))
    report.grants = [Grant(f"g{i}", "arrival", "a", 0, 0.5) for i in range(grants)]
    for i in range(finishes):
        timeline = Timeline(submit(f"f{i}"), "fifo")
        timeline.first_token(20 * MS)
        timeline.end("length", "", 5, 50 * MS, 4)
        report.finishes.append(Ended("length", Cause.NONE, 8, 0, timeline))
    return report


def test_without_a_lease_the_feed_is_off() -> None:
    feed = EventFeed()
    assert feed.until_ns == 0  # proc tests only this: nothing else runs
    feed.lease("f" * 32, 3.0, now=0)
    assert feed.until_ns == 3_000 * MS
    assert not feed.expire(3_000 * MS)  # ran out: off again
    assert feed.until_ns == 0


def test_a_lease_of_zero_ends_it_and_a_long_one_is_capped() -> None:
    feed = EventFeed()
    feed.lease("a" * 32, 1e9, now=0)
    assert feed.until_ns == int(events.MAX_LEASE_S * 1e9)
    feed.lease("b" * 32, 2.0, now=0)
    feed.lease("a" * 32, 0.0, now=1)
    assert feed.until_ns == 2_000 * MS  # b's lease still holds


def test_ticks_are_folded_into_one_update_per_interval() -> None:
    feed = EventFeed()
    feed.lease("f" * 32, 5.0, now=0)
    assert feed.due(1)  # a first viewer gets the state at once
    feed.take(1, [], [], LOAD)
    now = 1
    for _ in range(30):  # 30 ticks in 60 ms: no update is due yet
        now += 2 * MS
        feed.observe(tick(grants=1), now)
        assert not feed.due(now)
    now = 1 + events.INTERVAL_NS
    feed.observe(tick(finishes=1), now)
    assert feed.due(now)
    update = feed.take(now, [], [], LOAD)
    assert update.ticks == 31
    assert update.batch["tokens"] == 31 * 4 and update.batch["prefill_tokens"] == 31 * 3
    assert update.batch["generated"] == 31
    kinds = [e["kind"] for e in update.events]
    assert kinds == ["grant"] * 30 + ["finish"]
    assert not feed.due(now + events.INTERVAL_NS)  # nothing happened since: not yet
    assert feed.due(now + events.IDLE_INTERVAL_NS)  # but an idle engine still says so


def test_an_update_carries_slots_queue_and_blocks_and_survives_the_wire() -> None:
    feed = EventFeed("priority")
    feed.lease("f" * 32, 5.0, now=0)
    running = seq("r1", SequenceStatus.PREFILL, tenant="t1", prompt=40)
    running.slot, running.n_past = 1, 16
    waiting = [seq("w1", SequenceStatus.WAITING, tenant="t2", priority=3),
               seq("w2", SequenceStatus.WAITING, tenant="t2", priority=3),
               seq("w3", SequenceStatus.WAITING, tenant="t1")]  # fmt: skip
    update = feed.take(10, [None, running], waiting, LOAD)
    assert update.slots[0] is None
    assert update.slots[1] == {
        "request_id": "r1", "tenant": "t1", "priority": 0, "phase": "prefill", "n_past": 16,
        "prompt_tokens": 40, "cached_tokens": 0, "generated": 0, "max_tokens": 16,
    }  # fmt: skip
    assert update.queue == [
        {"tenant": "t2", "priority": 3, "count": 2},
        {"tenant": "t1", "priority": 0, "count": 1},
    ]
    assert update.kv == {"total": 64, "used": 10, "cached": 4, "free": 50}
    assert update.policy == "priority"
    assert decode(encode(update)) == update
    assert isinstance(decode(encode(update)), FeedUpdate)


def test_finish_and_rejection_events_carry_their_figures() -> None:
    feed = EventFeed()
    feed.lease("f" * 32, 5.0, now=0)
    report = tick(finishes=1)
    rejected = Timeline(submit("x", tenant="t9"), "fifo")
    report.rejections.append(Rejected(REJECT_QUEUE_FULL, rejected))
    feed.observe(report, 1)
    finish, reject = feed.take(2, [], [], LOAD).events
    assert finish["request_id"] == "f0" and finish["reason"] == "length"
    assert finish["ttft_ms"] == 20.0 and finish["itl_ms"] == 10.0  # (50 - 20) ms / 3 gaps
    assert reject == {"kind": "reject", "request_id": "x", "tenant": "t9", "priority": 0,
                      "reason": REJECT_QUEUE_FULL, "stage": "engine", "tick": 5}  # fmt: skip


def test_events_beyond_the_bound_are_counted_not_kept() -> None:
    feed = EventFeed()
    feed.lease("f" * 32, 5.0, now=0)
    feed.observe(tick(grants=events.MAX_EVENTS + 7), 1)
    update = feed.take(2, [], [], LOAD)
    assert len(update.events) == events.MAX_EVENTS
    assert update.batch["events_dropped"] == 7


def test_when_the_last_lease_ends_pending_data_is_dropped() -> None:
    feed = EventFeed()
    feed.lease("f" * 32, 1.0, now=0)
    feed.observe(tick(grants=3), 1)
    feed.expire(2_000 * MS)
    feed.lease("f" * 32, 1.0, now=2_000 * MS)
    assert feed.take(2_000 * MS + 1, [], [], LOAD).events == []


def test_embedding_parts_and_the_embedding_queue_are_in_the_update() -> None:
    """A tick's embedding part adds to the batch figures (a tick of a part alone is a tick);
    waiting embedding requests are counted apart from the generation queue."""
    feed = EventFeed()
    feed.lease("f" * 32, 5.0, now=0)
    beside = tick()
    beside.embed_batch = EmbedBatch(inputs=1, tokens=16, seconds=0.05, pieces=2)
    alone = TickReport(LOAD, embed_batch=EmbedBatch(inputs=8, tokens=480, seconds=0.9, pieces=8))
    feed.observe(beside, 1)
    feed.observe(alone, 2)
    waiting = [seq("e1", SequenceStatus.WAITING, tenant="t3"),
               seq("e2", SequenceStatus.WAITING, tenant="t3")]  # fmt: skip
    update = feed.take(events.INTERVAL_NS, [], [], LOAD, waiting)
    assert update.ticks == 2
    batch = update.batch
    assert (batch["embed_tokens"], batch["embed_rows"], batch["embed_inputs"]) == (496, 10, 9)
    assert batch["tokens"] == 4  # the generation batch's alone
    assert update.queue == []
    assert update.embed_queue == [{"tenant": "t3", "priority": 0, "count": 2}]
    assert decode(encode(update)) == update
