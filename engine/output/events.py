"""The dashboard's event feed, derived in ``proc.py`` from each tick's ``TickReport``.

Nothing here runs unless a frontend holds a lease (``FeedLease``, renewed while it has
viewers): ``EventFeed.until_ns`` is 0 otherwise, and ``proc.py`` tests only that before
doing anything else, so a node nobody watches pays one attribute test per pass.

While leased, every report is folded into the pending update (tick and batch sums, grants,
finishes and rejections as events; embedding parts as sums of their own); at most every
``INTERVAL_NS`` one ``FeedUpdate`` goes out with a snapshot of the slots, the queue, the
embedding requests' queue and the KV blocks, so a viewer gets at most ten updates a second
however fast the engine ticks. The core is never asked to do anything: the
snapshot reads its slots and its policy's waiting requests, as values, at send time.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from collections.abc import Sequence as Seq
from typing import Any

from tinyserve.engine.output.report import Load, TickReport
from tinyserve.engine.request.sequence import Sequence, SequenceStatus
from tinyserve.engine.request.timeline import Timeline
from tinyserve.feed_protocol import FeedUpdate

INTERVAL_NS = 100_000_000  # at most 10 updates a second
IDLE_INTERVAL_NS = 1_000_000_000  # an idle engine still says so once a second
MAX_LEASE_S = 10.0  # a frontend that asks for more gets this: a crash costs 10 s at most
MAX_EVENTS = 1000  # per update; more are counted in batch["events_dropped"], not sent


class EventFeed:
    """Leases, the pending update, and when to send it. Single-threaded, like proc."""

    def __init__(self, policy: str = "") -> None:
        self.policy = policy  # the engine's --policy, for viewers
        self._leases: dict[str, int] = {}  # frontend id -> lease end (monotonic ns)
        self.until_ns = 0  # the latest lease end; 0: nobody watches
        self._seq = 0
        self._sent_ns = 0
        self._reset()

    def _reset(self) -> None:
        self._started_ns = 0
        self._ticks = 0
        self._batch: dict[str, float] = dict.fromkeys(
            ("requests", "tokens", "prefill_tokens", "decode_tokens", "decode_s", "generated",
             "embed_tokens", "embed_rows", "embed_inputs", "embed_s"), 0
        )  # fmt: skip
        self._events: list[dict[str, Any]] = []
        self._dropped = 0

    # -- leases ------------------------------------------------------------------------------

    def lease(self, frontend_id: str, seconds: float, now: int) -> None:
        """A frontend's viewers want the feed for ``seconds`` more (0: it has none left)."""
        seconds = min(max(seconds, 0.0), MAX_LEASE_S)
        if seconds > 0:
            self._leases[frontend_id] = now + int(seconds * 1e9)
        else:
            self._leases.pop(frontend_id, None)
        self.expire(now)

    def expire(self, now: int) -> bool:
        """Drop ended leases; whether any lease still holds (if none, pending data goes)."""
        self._leases = {fid: end for fid, end in self._leases.items() if end > now}
        was_on = self.until_ns != 0
        self.until_ns = max(self._leases.values(), default=0)
        if not self.until_ns:
            self._reset()
        elif not was_on:
            self._sent_ns = now - IDLE_INTERVAL_NS  # a first viewer gets the state at once
        return bool(self.until_ns)

    # -- one pass ----------------------------------------------------------------------------

    def observe(self, report: TickReport, now: int) -> None:
        """Fold one pass's report into the pending update."""
        if not self._started_ns:
            self._started_ns = now
        tick = report.load.tick
        if report.batch is not None:
            b, batch = self._batch, report.batch
            self._ticks += 1
            b["requests"] = max(b["requests"], batch.requests)  # the largest batch
            b["tokens"] += batch.tokens
            b["prefill_tokens"] += batch.prefill_tokens
            b["decode_tokens"] += batch.decode_tokens
            b["decode_s"] += batch.decode_s
        self._batch["generated"] += report.generated
        if report.embed_batch is not None:  # the tick's embedding part (a tick alone, or not)
            b, part = self._batch, report.embed_batch
            self._ticks += report.batch is None
            b["embed_tokens"] += part.tokens
            b["embed_rows"] += part.pieces
            b["embed_inputs"] += part.inputs
            b["embed_s"] += part.seconds
        events = [grant_event(g.request_id, g.tenant, g.priority, g.rule, g.wait_s, tick)
                  for g in report.grants]  # fmt: skip
        for finish in report.finishes:
            events.append(finish_event(finish.timeline, finish.cause.value, tick))
        for rejection in report.rejections:
            events.append(reject_event(rejection.timeline, rejection.reason, tick))
        room = MAX_EVENTS - len(self._events)
        self._events += events[:room]
        self._dropped += max(0, len(events) - room)

    def due(self, now: int) -> bool:
        """Whether an update should go out now: the interval passed and something happened
        (or, when nothing did, the idle interval passed)."""
        since = now - self._sent_ns
        if since < INTERVAL_NS:
            return False
        return bool(self._ticks or self._events) or since >= IDLE_INTERVAL_NS

    def take(
        self,
        now: int,
        slots: Seq[Sequence | None],
        waiting: Iterable[Sequence],
        load: Load,
        embed_waiting: Iterable[Sequence] = (),
    ) -> FeedUpdate:
        """The pending update with the state now; starts the next one."""
        self._seq += 1
        window_s = (now - (self._started_ns or now)) / 1e9
        if self._dropped:
            self._batch["events_dropped"] = self._dropped
        kv = {
            "total": load.blocks_total,
            "used": load.blocks_used,
            "cached": load.blocks_cached,
            "free": load.blocks_total - load.blocks_used - load.blocks_cached,
        }
        update = FeedUpdate(
            self._seq,
            now,
            window_s,
            load.tick,
            self._ticks,
            self._batch,
            [slot_state(seq) for seq in slots],
            queue_state(waiting),
            kv,
            self._events,
            self.policy,
            queue_state(embed_waiting),
        )
        self._sent_ns = now
        self._reset()
        self._started_ns = now
        return update


def grant_event(
    request_id: str, tenant: str, priority: int, rule: str, wait_s: float, tick: int
) -> dict[str, Any]:
    return {
        "kind": "grant",
        "request_id": request_id,
        "tenant": tenant,
        "priority": priority,
        "rule": rule,
        "wait_ms": round(wait_s * 1e3, 3),
        "tick": tick,
    }


def finish_event(timeline: Timeline, cause: str, tick: int) -> dict[str, Any]:
    """A finish with the figures a viewer charts: TTFT, mean ITL, queue wait, cache reuse."""
    request, end = timeline.request, timeline.finish
    generated = end.generated if end else 0
    first = timeline.first_token_ns
    ttft_ms = timeline.since_arrival(first) if first else None
    itl_ms = None
    if first and end and generated > 1:
        itl_ms = round((end.ns - first) / 1e6 / (generated - 1), 3)
    return {
        "kind": "finish",
        "request_id": request.request_id,
        "tenant": request.tenant,
        "priority": request.priority,
        "reason": end.reason if end else "",
        "cause": cause,
        "slot": timeline.slot.slot_index if timeline.slot else None,
        "prompt_tokens": len(request.prompt_ids),
        "cached_tokens": timeline.prefix_tokens,
        "generated": generated,
        "wait_ms": timeline.wait_ms(),
        "ttft_ms": ttft_ms,
        "itl_ms": itl_ms,
        "tick": tick,
    }


def reject_event(timeline: Timeline, reason: str, tick: int) -> dict[str, Any]:
    request = timeline.request
    return {
        "kind": "reject",
        "request_id": request.request_id,
        "tenant": request.tenant,
        "priority": request.priority,
        "reason": reason,
        "stage": "engine",
        "tick": tick,
    }


def slot_state(seq: Sequence | None) -> dict[str, Any] | None:
    """What a slot holds now: None when free."""
    if seq is None:
        return None
    request = seq.request
    return {
        "request_id": seq.request_id,
        "tenant": request.tenant,
        "priority": request.priority,
        "phase": "prefill" if seq.status is SequenceStatus.PREFILL else "decode",
        "n_past": seq.n_past,
        "prompt_tokens": seq.prompt_len,
        "cached_tokens": seq.timeline.prefix_tokens,
        "generated": seq.generated,
        "max_tokens": request.max_tokens,
    }


def queue_state(waiting: Iterable[Sequence]) -> list[dict[str, Any]]:
    """Waiting requests counted by tenant and priority, largest group first."""
    groups = Counter((seq.request.tenant, seq.request.priority) for seq in waiting)
    return [
        {"tenant": tenant, "priority": priority, "count": count}
        for (tenant, priority), count in groups.most_common()
    ]
