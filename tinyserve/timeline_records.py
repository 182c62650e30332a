"""The steps of a request's timeline, declared once, for the engine and the frontend.

The engine records each step as a record of nanosecond ``CLOCK_MONOTONIC`` stamps
(``engine/request/timeline.py``) and turns it into its wire form (JSON-able, milliseconds since the
frontend's arrival) with the record's ``wire``; the ``*Wire`` types name the keys of that form,
which the frontend reads (``GET /v1/requests/{id}``, ``"timeline": true`` replies, the request
log line). ``docs/observability.md`` lists every field.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple, NotRequired, TypedDict, cast

NS_PER_MS = 1_000_000


def ms(ns: int) -> float:
    """Nanoseconds as milliseconds, rounded to the microsecond."""
    return round(ns / NS_PER_MS, 3)


# -- the wire form ---------------------------------------------------------------------------


class AcceptedWire(TypedDict):
    tick: int
    ms: float
    running: int
    waiting: int


class QueueWire(TypedDict, total=False):
    policy: str
    wait_ms: float | None
    ahead: int | None
    rule: str  # only once a slot was granted


class SlotWire(TypedDict):
    index: int
    tick: int
    ms: float


class ChunkWire(TypedDict):
    tick: int
    tokens: int
    ms: float
    end_ms: float
    decode_ms: float


class DecodeWire(TypedDict):
    ticks: int
    ms: float
    runs: list[list[int | float]]  # [first tick, ticks, batch, ms] per run


class FinishWire(TypedDict):
    reason: str
    detail: str
    tick: int
    ms: float
    generated_tokens: int


class GrammarWire(TypedDict):
    """A constrained request's grammar: its hash, how long llama.cpp took to build its
    sampler at the slot grant, and the tokens for which the grammar refused the chain's pick
    (each cost a pass of the grammar over the whole vocabulary)."""

    hash: str
    full_passes: int
    build_ms: float


class SharedPrefillWire(TypedDict):
    """A choice (n > 1) that copied its prompt's KV from the choice that prefilled it."""

    request_id: str  # the choice that prefilled the prompt
    tokens: int  # prompt tokens copied (llama_memory_seq_cp), not prefilled by this one


class RestoreWire(TypedDict):
    """Prompt tokens the prefix cache wrote into the request's slot at its grant (they are
    its prefix_reused_tokens): from host memory, or from blocks read from disk at start."""

    tier: str  # host, disk
    tokens: int
    ms: float


class PromptFromWire(TypedDict):
    """Where the prompt's tokens came from: the tiers of the prefix cache, another choice's
    prefill (n > 1), or computed by this request's own prefill chunks."""

    slot: int  # kept in the granted slot by its last request: nothing copied
    host: int  # written into the slot from the prefix cache in host memory
    disk: int  # the same, from blocks read from --cache-dir at start
    leader: int  # copied from the choice that prefilled them
    computed: int  # prefilled by this request (positions recomputed for logprobs included)


class SpeculationWire(TypedDict):
    """Tokens guessed from the request's own text (``--speculate``): totals, and each decode
    step that carried a guess as ``[tick, guessed, accepted]``."""

    guessed: int
    accepted: int
    steps: list[list[int]]


class TimelineWire(TypedDict):
    """A whole timeline as the API returns it (``grammar`` only for constrained requests)."""

    request_id: str
    status: str  # waiting, running, finished
    tenant: str
    priority: int
    prompt_tokens: int
    admission: dict[str, Any] | None
    accepted: AcceptedWire | None
    queue: QueueWire | None
    slot: SlotWire | None
    prefix_reused_tokens: int
    prompt_from: PromptFromWire
    prefill: list[ChunkWire]
    first_token_ms: float | None
    decode: DecodeWire
    finish: FinishWire | None
    grammar: NotRequired[GrammarWire]
    # A choice that shared another's prefill; prompt tokens the prefix cache held but that
    # were prefilled again because the request wanted their logprobs.
    shared_prefill: NotRequired[SharedPrefillWire]
    prefix_recomputed_tokens: NotRequired[int]
    restore: NotRequired[RestoreWire]  # only when the prefix cache wrote the reused tokens
    speculation: NotRequired[SpeculationWire]  # only when it guessed at all


def read_wire(timeline: Mapping[str, Any]) -> TimelineWire:
    """A timeline received from the engine (msgpack gives a plain dict), typed for reading."""
    return cast(TimelineWire, timeline)


def slot_ms(timeline: Mapping[str, Any] | None) -> float | None:
    """Arrival to slot grant from a timeline's wire form; None without a slot."""
    slot = read_wire(timeline).get("slot") if timeline else None
    return slot["ms"] if slot else None


# -- the steps, as the engine records them -----------------------------------------------------


class Accepted(NamedTuple):
    """The engine took the request into its queue; the requests running and waiting then."""

    tick: int
    ns: int
    running: int
    waiting: int

    def wire(self, arrival_ns: int) -> AcceptedWire:
        return {
            "tick": self.tick,
            "ms": ms(self.ns - arrival_ns),
            "running": self.running,
            "waiting": self.waiting,
        }


class SlotGrant(NamedTuple):
    """A slot was granted: why (the policy's rule) and how many got one ahead of it."""

    tick: int
    ns: int
    slot_index: int  # not ``index``: a tuple's method
    rule: str
    ahead: int

    def wire(self, arrival_ns: int) -> SlotWire:
        return {"index": self.slot_index, "tick": self.tick, "ms": ms(self.ns - arrival_ns)}


class PrefillChunk(NamedTuple):
    """A prefill chunk's tick: ``gap_ns`` since the previous step, ``decode_ns`` of the
    tick's ``llama_decode`` (shared with its batch)."""

    tick: int
    tokens: int
    end_ns: int
    gap_ns: int
    decode_ns: int

    @property
    def start_ns(self) -> int:
        return self.end_ns - self.gap_ns

    def wire(self, arrival_ns: int) -> ChunkWire:
        return {
            "tick": self.tick,
            "tokens": self.tokens,
            "ms": ms(self.gap_ns),
            "end_ms": ms(self.end_ns - arrival_ns),
            "decode_ms": ms(self.decode_ns),
        }


class DecodeRun(NamedTuple):
    """Consecutive decode ticks with the same batch size, ``ns`` in total."""

    first_tick: int
    ticks: int
    batch: int
    ns: int

    def follows(self, tick: int, batch: int) -> bool:
        """Whether a decode tick ``tick`` of batch ``batch`` continues this run."""
        return self.batch == batch and self.first_tick + self.ticks == tick

    def plus(self, ns: int) -> DecodeRun:
        """This run one tick longer."""
        return self._replace(ticks=self.ticks + 1, ns=self.ns + ns)

    def wire(self) -> list[int | float]:
        return [self.first_tick, self.ticks, self.batch, ms(self.ns)]


class Finished(NamedTuple):
    """How the request ended, and the tokens it generated."""

    reason: str
    detail: str
    tick: int
    ns: int
    generated: int

    def wire(self, arrival_ns: int) -> FinishWire:
        return {
            "reason": self.reason,
            "detail": self.detail,
            "tick": self.tick,
            "ms": ms(self.ns - arrival_ns),
            "generated_tokens": self.generated,
        }


def decode_wire(runs: list[DecodeRun]) -> DecodeWire:
    return {
        "ticks": sum(run.ticks for run in runs),
        "ms": ms(sum(run.ns for run in runs)),
        "runs": [run.wire() for run in runs],
    }
