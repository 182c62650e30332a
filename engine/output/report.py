"""What one tick did, as plain values: the one report ``EngineCore.step`` returns.

``proc.py`` derives everything from it: the wire messages, the board, the metrics and the
spans. The core itself calls no transport, tracing or metrics code.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from tinyserve.engine.kv.host_cache import CacheStats
from tinyserve.engine.request.timeline import Timeline
from tinyserve.protocol import Embedded, RequestUpdate

# How a policy chose the request that got a slot (``Grant.rule``).
RULE_ARRIVAL = "arrival"  # fifo: the oldest waiting request
RULE_PRIORITY = "priority"  # priority: the highest priority waiting
RULE_TENANT = "tenant"  # wfq: the backlogged tenant with the smallest virtual time
RULE_DEADLINE = "deadline"  # deadline: the earliest due time (none: last, by arrival)
RULE_WORK = "shortest"  # srpt: the smallest work, aged by the time waited


class Cause(enum.Enum):
    """Who ended a request that did not run to its own end (``Ended.cause``)."""

    NONE = "none"  # it ended by itself: stop, length, or an error
    CLIENT = "client"  # its frontend sent a Cancel (client gone, stalled, drain)
    FRONTEND_GONE = "frontend_gone"  # its frontend's process died
    REQUEST_TIMEOUT = "request_timeout"  # --request-timeout
    QUEUE_TIMEOUT = "queue_timeout"  # --queue-timeout
    DEADLINE = "deadline"  # the request's own deadline_ms passed
    ENGINE = "engine"  # the engine stopped (drain timeout)


@dataclass(frozen=True, slots=True)
class Grant:
    """A waiting request got a slot: why (the policy's rule, as fields) and after how long."""

    request_id: str
    rule: str  # one of the RULE_* kinds
    tenant: str
    priority: int
    wait_s: float  # the timeline's wait: acceptance to slot grant


@dataclass(frozen=True, slots=True)
class Ended:
    """A request that had been accepted ended this tick."""

    reason: str  # FINISH_*
    cause: Cause
    prompt_tokens: int
    cached_tokens: int
    timeline: Timeline


@dataclass(frozen=True, slots=True)
class Rejected:
    """A request turned away at acceptance (``reason`` is a REJECT_*)."""

    reason: str
    timeline: Timeline


@dataclass(frozen=True, slots=True)
class Batch:
    """The batch the tick decoded."""

    requests: int
    tokens: int
    prefill_tokens: int
    decode_tokens: int
    decode_s: float  # llama_decode alone


@dataclass(frozen=True, slots=True)
class Load:
    """The engine's load at the end of the tick, taken once for the board and the gauges."""

    tick: int
    waiting: int
    running: int
    blocks_total: int  # KV blocks of every slot's cells
    blocks_used: int  # of them, those running requests fill
    blocks_cached: int  # those free slots keep of their last request
    drain_rate: float  # requests leaving per second of work (engine/scheduling/drain.py)
    embed_waiting: int = 0  # embedding requests queued, not yet in a part


@dataclass(slots=True)
class Guessed:
    """A tick's speculation: decode rows with guesses, tokens guessed, tokens confirmed."""

    steps: int = 0
    tokens: int = 0
    accepted: int = 0

    def add(self, tokens: int, accepted: int) -> None:
        self.steps += 1
        self.tokens += tokens
        self.accepted += accepted


@dataclass(frozen=True, slots=True)
class EmbedBatch:
    """The embedding part a tick ran (for the metrics and the feed): the inputs whose vector
    it finished, its tokens, its decode's time, and its pieces (rows of inputs)."""

    inputs: int
    tokens: int
    seconds: float
    pieces: int = 0


@dataclass(slots=True)
class TickReport:
    """Everything one tick (or one idle pass) produced.

    ``updates`` are the wire updates per frontend id; ``cache`` is the prefix cache's running
    totals; ``embedded`` the embedding requests that ended, ``embed_batch`` the embedding batch
    the tick ran; ``guessed`` its speculation.
    """

    load: Load
    updates: dict[str, list[RequestUpdate]] = field(default_factory=dict)
    grants: list[Grant] = field(default_factory=list)
    finishes: list[Ended] = field(default_factory=list)
    rejections: list[Rejected] = field(default_factory=list)
    batch: Batch | None = None
    cache: CacheStats | None = None
    embedded: list[Embedded] = field(default_factory=list)
    embed_batch: EmbedBatch | None = None
    guessed: Guessed = field(default_factory=Guessed)

    @property
    def generated(self) -> int:
        """Tokens generated this tick: those the updates carry."""
        return sum(len(u.token_ids) for ups in self.updates.values() for u in ups)

    def ended(self) -> list[Timeline]:
        """Timelines of the requests that ended this tick, rejected ones included."""
        return [f.timeline for f in self.finishes] + [r.timeline for r in self.rejections]
