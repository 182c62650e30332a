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

import logging
from collections import OrderedDict
from typing import Any

from tinyserve.logs import fields
from tinyserve.protocol import Submit
from tinyserve.timeline_records import (
    Accepted,
    DecodeRun,
    Finished,
    GrammarWire,
    PrefillChunk,
    PromptFromWire,
    QueueWire,
    RestoreWire,
    SharedPrefillWire,
    SlotGrant,
    TimelineWire,
    decode_wire,
    ms,
)

log = logging.getLogger(__name__)


class Timeline:
    """One request's engine-side history. Single-threaded, like the core that writes it."""

    __slots__ = (
        "_last_ns",
        "accepted",
        "chunks",
        "decode_runs",
        "finish",
        "first_token_ns",
        "grammar",
        "grants_at_accept",
        "guesses",
        "policy",
        "prefix_recomputed",
        "prefix_tokens",
        "request",
        "restore",
        "shared_prefill",
        "slot",
    )

    def __init__(self, request: Submit, policy: str) -> None:
        self.request = request
        self.policy = policy
        self.accepted: Accepted | None = None
        self.grants_at_accept = 0
        self.slot: SlotGrant | None = None
        self.prefix_tokens = 0
        self.shared_prefill: SharedPrefillWire | None = None
        self.prefix_recomputed = 0  # cached prompt tokens prefilled again for their logits
        self.chunks: list[PrefillChunk] = []
        self.decode_runs: list[DecodeRun] = []
        self.first_token_ns = 0
        self.finish: Finished | None = None
        self.grammar: GrammarWire | None = None  # set at the slot grant of a constrained one
        self.restore: RestoreWire | None = None  # the prefix cache wrote the reused tokens
        self.guesses: list[list[int]] = []  # [tick, guessed, accepted] per step with a guess
        self._last_ns = 0

    # -- recording ---------------------------------------------------------------------------

    def accept(self, tick: int, now: int, grants: int, running: int, waiting: int) -> None:
        self.accepted = Accepted(tick, now, running, waiting)
        self.grants_at_accept = grants
        self._last_ns = now

    def reused(self, tokens: int, tier: str, ns: int) -> None:
        """At the grant, its slot held its prompt's first ``tokens``: kept there (``ns`` 0),
        or written there from the prefix cache's ``tier`` in ``ns``."""
        self.prefix_tokens = tokens
        if tokens and ns:
            self.restore = {"tier": tier, "tokens": tokens, "ms": ms(ns)}

    def grant(self, tick: int, now: int, slot: int, rule: str, grants: int) -> None:
        """A slot was granted; ``grants`` counts slot grants so far (this one not included)."""
        self.slot = SlotGrant(tick, now, slot, rule, grants - self.grants_at_accept)
        self._last_ns = now

    def log_grant(self, waiting: int) -> None:
        """The grant as a debug line, with the ``waiting`` requests it left in the queue."""
        if self.slot is not None and log.isEnabledFor(logging.DEBUG):
            log.debug(
                "slot granted",
                extra=fields(
                    request_id=self.request.request_id,
                    slot=self.slot.slot_index,
                    policy=self.policy,
                    rule=self.slot.rule,
                    ahead=self.slot.ahead,
                    waited_ms=self.wait_ms(),
                    waiting=waiting,
                    reused=self.prefix_tokens,
                ),
            )

    def prefill_chunk(self, tick: int, tokens: int, now: int, decode_ns: int) -> None:
        self.chunks.append(PrefillChunk(tick, tokens, now, now - self._last_ns, decode_ns))
        self._last_ns = now

    def decode_tick(self, tick: int, batch: int, now: int) -> None:
        interval = now - self._last_ns
        self._last_ns = now
        runs = self.decode_runs
        if runs and runs[-1].follows(tick, batch):
            runs[-1] = runs[-1].plus(interval)
        else:
            runs.append(DecodeRun(tick, 1, batch, interval))

    def forked(self, request_id: str, tokens: int) -> None:
        """Its first ``tokens`` prompt tokens' KV was copied from ``request_id``'s prefill."""
        self.shared_prefill = {"request_id": request_id, "tokens": tokens}

    def guessed(self, tick: int, tokens: int, accepted: int) -> None:
        """Its decode row of ``tick`` carried ``tokens`` guessed tokens; ``accepted`` held."""
        self.guesses.append([tick, tokens, accepted])

    def first_token(self, now: int) -> None:
        self.first_token_ns = now
        # A choice that copied another's prefill has no chunk ending here: its decode ticks
        # are still measured from its first token.
        self._last_ns = now

    def end(self, reason: str, detail: str, tick: int, now: int, generated: int) -> None:
        self.finish = Finished(reason, detail, tick, now, generated)

    # -- reading -----------------------------------------------------------------------------

    def since_arrival(self, ns: int) -> float:
        return ms(ns - self.request.arrival_ns)

    def wait_ms(self) -> float | None:
        """Acceptance to slot grant; None while it waits (or if it never got a slot)."""
        if self.accepted is None or self.slot is None:
            return None
        return ms(self.slot.ns - self.accepted.ns)

    def to_dict(self) -> dict[str, Any]:
        """The timeline as the API returns it (times in ms since the frontend's arrival)."""
        as_dict: dict[str, Any] = dict(self.wire())
        if self.shared_prefill is not None:
            as_dict["shared_prefill"] = self.shared_prefill
        if self.prefix_recomputed:
            as_dict["prefix_recomputed_tokens"] = self.prefix_recomputed
        return as_dict

    def wire(self) -> TimelineWire:
        """``to_dict``, typed: the keys are ``tinyserve.timeline_records``'s."""
        req, arrival = self.request, self.request.arrival_ns
        wire: TimelineWire = {
            "request_id": req.request_id,
            "status": self._status(),
            "tenant": req.tenant,
            "priority": req.priority,
            "prompt_tokens": len(req.prompt_ids),
            "admission": req.admission,
            "accepted": self.accepted.wire(arrival) if self.accepted else None,
            "queue": self._queue_wire(),
            "slot": self.slot.wire(arrival) if self.slot else None,
            "prefix_reused_tokens": self.prefix_tokens,
            "prompt_from": self._prompt_from(),
            "prefill": [chunk.wire(arrival) for chunk in self.chunks],
            "first_token_ms": self.since_arrival(self.first_token_ns)
            if self.first_token_ns
            else None,
            "decode": decode_wire(self.decode_runs),
            "finish": self.finish.wire(arrival) if self.finish else None,
        }
        if self.grammar is not None:
            wire["grammar"] = self.grammar
        if self.restore is not None:
            wire["restore"] = self.restore
        if self.guesses:
            wire["speculation"] = {
                "guessed": sum(g[1] for g in self.guesses),
                "accepted": sum(g[2] for g in self.guesses),
                "steps": self.guesses,
            }
        return wire

    def _prompt_from(self) -> PromptFromWire:
        tier = self.restore["tier"] if self.restore is not None else "slot"
        reused = self.prefix_tokens
        return {
            "slot": reused if tier == "slot" else 0,
            "host": reused if tier == "host" else 0,
            "disk": reused if tier == "disk" else 0,
            "leader": self.shared_prefill["tokens"] if self.shared_prefill else 0,
            "computed": sum(chunk.tokens for chunk in self.chunks),
        }

    def _status(self) -> str:
        if self.finish is not None:
            return "finished"
        return "running" if self.slot is not None else "waiting"

    def _queue_wire(self) -> QueueWire | None:
        if self.accepted is None:
            return None
        queue: QueueWire = {"policy": self.policy, "wait_ms": self.wait_ms(), "ahead": None}
        if self.slot is not None:
            queue["ahead"] = self.slot.ahead
            queue["rule"] = self.slot.rule
        return queue


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
