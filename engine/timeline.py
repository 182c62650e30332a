"""Per-request timelines: what happened to a request inside the engine, and when.

Every request gets one, always (recording is a few appends per tick). Stamps are
``CLOCK_MONOTONIC`` nanoseconds, which is host-wide, so the frontend's ``arrival_ns`` and the
engine's stamps share one time line. ``to_dict`` turns them into milliseconds relative to
arrival; every interval is measured from the end of the request's previous step, so
``accepted + wait = slot``, ``slot + sum(prefill ms) = first_token`` and
``first_token + sum(decode run ms) = finish`` hold by construction.

``RecentTimelines`` keeps the finished ones, oldest dropped first, for ``GET /v1/requests/{id}``.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from tinyserve.protocol import Submit

NS_PER_MS = 1_000_000


def _ms(ns: int) -> float:
    return round(ns / NS_PER_MS, 3)


class Timeline:
    """One request's engine-side history. Single-threaded, like the core that writes it."""

    __slots__ = (
        "_last_ns",
        "accepted",
        "chunks",
        "decode_runs",
        "finish",
        "first_token_ns",
        "grants_at_accept",
        "policy",
        "prefix_tokens",
        "request",
        "slot",
    )

    def __init__(self, request: Submit, policy: str) -> None:
        self.request = request
        self.policy = policy
        # tick, ns, own blocks reserved, requests running and waiting when it came
        self.accepted: tuple[int, int, int, int, int] | None = None
        self.grants_at_accept = 0
        self.slot: tuple[int, int, int, str, int] | None = None  # tick, ns, index, rule, ahead
        self.prefix_tokens = 0
        # tick, tokens, end ns, ns since the previous step, ns of the tick's llama_decode
        self.chunks: list[tuple[int, int, int, int, int]] = []
        # Consecutive decode ticks with the same batch size: [first tick, ticks, batch, ns].
        self.decode_runs: list[list[int]] = []
        self.first_token_ns = 0
        self.finish: tuple[str, str, int, int, int] | None = None  # reason, detail, tick, ns, n
        self._last_ns = 0

    # -- recording ---------------------------------------------------------------------------

    def accept(
        self, tick: int, now: int, blocks: int, grants: int, running: int, waiting: int
    ) -> None:
        self.accepted = (tick, now, blocks, running, waiting)
        self.grants_at_accept = grants
        self._last_ns = now

    def grant(self, tick: int, now: int, slot: int, rule: str, grants: int) -> None:
        """A slot was granted; ``grants`` counts slot grants so far (this one not included)."""
        self.slot = (tick, now, slot, rule, grants - self.grants_at_accept)
        self._last_ns = now

    def prefill_chunk(self, tick: int, tokens: int, now: int, decode_ns: int) -> None:
        self.chunks.append((tick, tokens, now, now - self._last_ns, decode_ns))
        self._last_ns = now

    def decode_tick(self, tick: int, batch: int, now: int) -> None:
        interval = now - self._last_ns
        self._last_ns = now
        runs = self.decode_runs
        if runs and runs[-1][2] == batch and runs[-1][0] + runs[-1][1] == tick:
            runs[-1][1] += 1
            runs[-1][3] += interval
        else:
            runs.append([tick, 1, batch, interval])

    def first_token(self, now: int) -> None:
        self.first_token_ns = now

    def end(self, reason: str, detail: str, tick: int, now: int, generated: int) -> None:
        self.finish = (reason, detail, tick, now, generated)

    # -- reading -----------------------------------------------------------------------------

    def since_arrival(self, ns: int) -> float:
        return _ms(ns - self.request.arrival_ns)

    def wait_ms(self) -> float | None:
        """Acceptance to slot grant; None while it waits (or if it never got a slot)."""
        if self.accepted is None or self.slot is None:
            return None
        return _ms(self.slot[1] - self.accepted[1])

    def to_dict(self) -> dict[str, Any]:
        """The timeline as the API returns it (times in ms since the frontend's arrival)."""
        req = self.request
        return {
            "request_id": req.request_id,
            "status": self._status(),
            "tenant": req.tenant,
            "priority": req.priority,
            "prompt_tokens": len(req.prompt_ids),
            "admission": req.admission,
            "accepted": self._accepted_dict(),
            "queue": self._queue_dict(),
            "slot": self._slot_dict(),
            "prefix_reused_tokens": self.prefix_tokens,
            "prefill": [self._chunk_dict(*chunk) for chunk in self.chunks],
            "first_token_ms": self.since_arrival(self.first_token_ns)
            if self.first_token_ns
            else None,
            "decode": {
                "ticks": sum(run[1] for run in self.decode_runs),
                "ms": _ms(sum(run[3] for run in self.decode_runs)),
                "runs": [[t, n, batch, _ms(ns)] for t, n, batch, ns in self.decode_runs],
            },
            "finish": self._finish_dict(),
        }

    def _chunk_dict(self, tick: int, tokens: int, end: int, gap: int, dec: int) -> dict[str, Any]:
        return {
            "tick": tick,
            "tokens": tokens,
            "ms": _ms(gap),
            "end_ms": self.since_arrival(end),
            "decode_ms": _ms(dec),
        }

    def _status(self) -> str:
        if self.finish is not None:
            return "finished"
        return "running" if self.slot is not None else "waiting"

    def _accepted_dict(self) -> dict[str, Any] | None:
        if self.accepted is None:
            return None
        tick, ns, blocks, running, waiting = self.accepted
        return {
            "tick": tick,
            "ms": self.since_arrival(ns),
            "blocks": blocks,
            "running": running,
            "waiting": waiting,
        }

    def _queue_dict(self) -> dict[str, Any] | None:
        if self.accepted is None:
            return None
        queue: dict[str, Any] = {"policy": self.policy, "wait_ms": self.wait_ms(), "ahead": None}
        if self.slot is not None:
            _, _, _, rule, ahead = self.slot
            queue.update(ahead=ahead, rule=rule)
        return queue

    def _slot_dict(self) -> dict[str, Any] | None:
        if self.slot is None:
            return None
        tick, ns, index, _, _ = self.slot
        return {"index": index, "tick": tick, "ms": self.since_arrival(ns)}

    def _finish_dict(self) -> dict[str, Any] | None:
        if self.finish is None:
            return None
        reason, detail, tick, ns, generated = self.finish
        return {
            "reason": reason,
            "detail": detail,
            "tick": tick,
            "ms": self.since_arrival(ns),
            "generated_tokens": generated,
        }


class RecentTimelines:
    """The timelines of the last ``capacity`` finished requests, by request id."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._items: OrderedDict[str, dict[str, Any]] = OrderedDict()

    def add(self, request_id: str, timeline: dict[str, Any]) -> None:
        if self.capacity <= 0:
            return
        self._items[request_id] = timeline
        self._items.move_to_end(request_id)
        while len(self._items) > self.capacity:
            self._items.popitem(last=False)

    def get(self, request_id: str) -> dict[str, Any] | None:
        return self._items.get(request_id)

    def __len__(self) -> int:
        return len(self._items)
