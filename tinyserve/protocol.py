"""Every message that crosses a process boundary, and its msgpack encoding.

Frontend -> engine (PUSH/PULL): ``Hello``, ``Submit``, ``Embed``, ``Cancel``,
``TimelineQuery``, ``FeedLease``.
Engine -> frontend (PUB/SUB, topic = frontend id): ``HelloAck``, ``TickOutput``, ``Embedded``,
``TimelineReply``; on the topic ``FEED_TOPIC``, to every frontend that subscribed to it,
``FeedUpdate`` (``feed_protocol.py``).

A frame is ``msgpack([PROTOCOL_VERSION, tag, *fields])``; nested messages are lists of their
fields in declaration order. A frame with another version or an unknown tag raises
``ProtocolError``, which receivers log and drop. No pickle anywhere.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

import msgpack

from tinyserve.feed_protocol import FeedLease, FeedUpdate

# Re-exported: every receiver catches ``protocol.ProtocolError`` from ``decode``.
from tinyserve.wire import Message as Message
from tinyserve.wire import ProtocolError as ProtocolError

# 2: no TickOutput.stats, Submit.want_timeline or events (accepted)
# 3: FeedLease and FeedUpdate (the dashboard's event feed, GET /v1/events)
# 4: Embed and Embedded (/v1/embeddings)
PROTOCOL_VERSION = 4

# Ways a request can end; the same strings appear in replies and metrics.
FINISH_STOP = "stop"
FINISH_LENGTH = "length"
FINISH_CANCELLED = "cancelled"
FINISH_QUEUE_TIMEOUT = "queue_timeout"
FINISH_TIMEOUT = "timeout"
FINISH_ERROR = "error"
FINISH_REJECTED = "rejected"
FINISH_CLIENT_STALLED = "client_stalled"  # a cancel: the client stopped reading its stream
FINISH_DEADLINE_MISSED = "deadline_missed"  # unfinished when its deadline_ms passed

# Why the engine turned a request away (FINISH_REJECTED); the frontend answers 503 or 400.
REJECT_QUEUE_FULL = "queue_full"
REJECT_DRAINING = "draining"
REJECT_TOO_LONG = "context_exceeded"  # can never fit, even in an empty engine: a 400

# A tenant's name, as a request gives it and as --tenant-weights names it (a metric label).
TENANT_PATTERN = r"^[A-Za-z0-9._-]{1,64}$"
TENANT_TEXT = "1 to 64 characters of A-Z, a-z, 0-9, '.', '_', '-'"

# Engine states, shared with the board.
STATE_STARTING = 0
STATE_READY = 1
STATE_DRAINING = 2


@dataclass(frozen=True, slots=True)
class SamplingParams(Message):
    """How to pick each next token. ``temperature == 0`` means greedy."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logprobs: int = -1  # top alternatives to report per token (-1: no logprobs at all)
    ignore_eos: bool = False  # never sample an end-of-generation token
    min_p: float = 0.0  # drop tokens less likely than min_p times the likeliest (0: off)
    typical_p: float = 1.0  # locally typical sampling (1: off)
    repetition_penalty: float = 1.0  # divide the logits of recent tokens (1: off)
    logit_bias: dict[int, float] = field(default_factory=dict)  # token id -> added to its logit
    min_tokens: int = 0  # no end-of-generation token before this many tokens
    grammar: str = ""  # GBNF every token must obey ("": none); the frontend compiled it


# -- frontend -> engine -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Hello(Message):
    """A frontend announcing itself; repeated until the engine's ``HelloAck`` arrives."""

    TAG: ClassVar[int] = 1
    frontend_id: str
    pid: int


@dataclass(frozen=True, slots=True)
class Submit(Message):
    """One generation request, already validated and tokenized by the frontend."""

    TAG: ClassVar[int] = 2
    NESTED: ClassVar[dict[str, Any]] = {"sampling": SamplingParams}
    request_id: str
    frontend_id: str
    prompt_ids: list[int]
    sampling: SamplingParams
    max_tokens: int
    priority: int = 0
    tenant: str = "default"
    arrival_ns: int = 0  # time.monotonic_ns() at the frontend (CLOCK_MONOTONIC is host-wide)
    trace_context: dict[str, str] = field(default_factory=dict)
    # The frontend's admission decision and the board figures it was based on (timeline).
    admission: dict[str, Any] = field(default_factory=dict)
    # Logprobs of the prompt's own tokens (after the first), with this many alternatives
    # each (-1: none). Positions the prefix cache holds are prefilled again for their logits.
    prompt_logprobs: int = -1
    # Another choice of the same prompt (n > 1): the request id of the one that prefills it.
    # This one copies its KV (llama_memory_seq_cp) instead of prefilling it again.
    fork_of: str = ""
    deadline_ms: int = 0  # finish within this many ms of arrival_ns (0: no deadline)


@dataclass(frozen=True, slots=True)
class Cancel(Message):
    """Stop a request (client gone, frontend draining). Unknown ids are ignored."""

    TAG: ClassVar[int] = 3
    request_id: str
    frontend_id: str
    reason: str = FINISH_CANCELLED


@dataclass(frozen=True, slots=True)
class TimelineQuery(Message):
    """A frontend asking for a recent request's timeline (``GET /v1/requests/{id}``); the
    engine answers with a ``TimelineReply`` on the frontend's topic."""

    TAG: ClassVar[int] = 4
    frontend_id: str
    query_id: int
    request_id: str


@dataclass(frozen=True, slots=True)
class Embed(Message):
    """One ``/v1/embeddings`` request: its inputs tokenized by the frontend (with the vocabulary
    of the model that embeds). The engine answers with one ``Embedded``."""

    TAG: ClassVar[int] = 6
    request_id: str
    frontend_id: str
    inputs: list[list[int]]
    arrival_ns: int = 0  # time.monotonic_ns() at the frontend
    # Ordered among embedding requests by --policy, as Submit's are among generation ones.
    priority: int = 0
    tenant: str = "default"


# -- engine -> frontend -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HelloAck(Message):
    """The engine's answer to ``Hello``: facts learned at start-up travel here, not in config."""

    TAG: ClassVar[int] = 11
    frontend_id: str
    engine_pid: int
    engine_started_ns: int  # identifies this engine incarnation
    model_name: str
    n_ctx: int
    n_vocab: int
    slots: int
    block_size: int
    blocks_total: int
    max_queue: int
    gpu_layers: int = 0  # layers the engine offloaded to a GPU (-1: all of them)
    embedding_size: int = 0  # dimensions of a /v1/embeddings vector


@dataclass(frozen=True, slots=True)
class RequestUpdate(Message):
    """What happened to one request during one tick.

    ``seq`` counts this request's updates from 0 so a frontend can detect a dropped message.
    ``text`` is raw UTF-8 bytes that are safe to show (stop strings already cut, bytes that
    could still turn out to start a stop string held back); the frontend decodes it
    incrementally since a character may be split across updates. ``accepted`` is set on the
    update of the tick the engine accepted the request (the only lifecycle step a frontend
    acts on; the rest is in the final update's ``timeline``).
    """

    request_id: str
    seq: int
    token_ids: list[int] = field(default_factory=list)
    text: bytes = b""
    accepted: bool = False
    finish_reason: str | None = None
    detail: str = ""  # error message or rejection reason
    prompt_tokens: int = 0
    cached_tokens: int = 0
    timeline: dict[str, Any] | None = None
    # One entry per token in token_ids when the request asked for logprobs:
    # [chosen token's logprob, [[token id, logprob], ...] top alternatives, best first].
    logprobs: list[list[Any]] = field(default_factory=list)
    # When Submit.prompt_logprobs >= 0: entries (as ``logprobs``) for the prompt tokens whose
    # logits this tick computed, in prompt order from the second token on.
    prompt_logprobs: list[list[Any]] = field(default_factory=list)
    # Prompt tokens in the request's KV cells after this tick, cached ones included, on the
    # update of every tick that ran one of its prefill chunks (0: no news); the frontend turns
    # it into progress events. ``cached_tokens`` comes with it from the first such update on.
    prompt_done: int = 0
    # On the final update of a request its stop string ended: which one (as the request gave it).
    stop_string: str = ""

    @property
    def ended(self) -> bool:
        return self.finish_reason is not None

    def merge(self, later: RequestUpdate) -> RequestUpdate:
        """This update and ``later`` (of the same request) as one: the output of both in
        order, ``accepted`` if either was, the prefill's progress as far as either got, and
        the end from whichever has it (``later``'s first). Keeps this one's ``seq``: merging
        happens on one side of the wire only."""
        end = later if later.ended else self
        return RequestUpdate(
            self.request_id,
            self.seq,
            self.token_ids + later.token_ids,
            self.text + later.text,
            self.accepted or later.accepted,
            end.finish_reason,
            end.detail,
            end.prompt_tokens,
            later.cached_tokens or self.cached_tokens,
            end.timeline,
            self.logprobs + later.logprobs,
            self.prompt_logprobs + later.prompt_logprobs,
            max(self.prompt_done, later.prompt_done),
            end.stop_string,
        )


@dataclass(frozen=True, slots=True)
class TickOutput(Message):
    """All updates for one frontend's requests from one engine tick."""

    TAG: ClassVar[int] = 12
    NESTED: ClassVar[dict[str, Any]] = {"updates": [RequestUpdate]}
    frontend_id: str
    updates: list[RequestUpdate]


@dataclass(frozen=True, slots=True)
class TimelineReply(Message):
    """The answer to a ``TimelineQuery``: the timeline, or None when the engine does not
    know the id (never seen, or older than the recent requests it keeps)."""

    TAG: ClassVar[int] = 13
    frontend_id: str
    query_id: int
    timeline: dict[str, Any] | None


@dataclass(frozen=True, slots=True)
class Embedded(Message):
    """The end of an ``Embed``: one L2-normalised vector per input, in order, each as
    little-endian float32 bytes (what OpenAI's base64 encoding carries), when
    ``finish_reason`` is ``stop``; else why not (rejected with a REJECT_* ``detail``,
    cancelled, error)."""

    TAG: ClassVar[int] = 15
    frontend_id: str
    request_id: str
    finish_reason: str
    vectors: list[bytes] = field(default_factory=list)
    prompt_tokens: int = 0
    detail: str = ""


_BY_TAG: dict[int, type[Message]] = {
    cls.TAG: cls
    for cls in (
        Hello,
        Submit,
        Embed,
        Cancel,
        TimelineQuery,
        FeedLease,
        HelloAck,
        TickOutput,
        Embedded,
        TimelineReply,
        FeedUpdate,
    )
}


def encode(message: Message) -> bytes:
    """One wire frame for ``message``."""
    frame: bytes = msgpack.packb(
        [PROTOCOL_VERSION, message.TAG, *message.to_wire()], use_bin_type=True
    )
    return frame


def decode(frame: bytes) -> Message:
    """Parse a frame; raises ``ProtocolError`` for anything that is not a current message."""
    try:
        items = msgpack.unpackb(frame, raw=False, strict_map_key=False)
    # TypeError: a map whose key is itself a map or a list (unhashable), e.g. b"\x81\x80\x00".
    except (
        ValueError,
        TypeError,
        msgpack.ExtraData,
        msgpack.FormatError,
        msgpack.StackError,
    ) as exc:
        raise ProtocolError(f"undecodable frame: {exc}") from exc
    if not isinstance(items, list) or len(items) < 2:
        raise ProtocolError("frame is not [version, tag, ...]")
    version, tag = items[0], items[1]
    if version != PROTOCOL_VERSION:
        raise ProtocolError(f"protocol version {version!r}, expected {PROTOCOL_VERSION}")
    cls = _BY_TAG.get(tag) if isinstance(tag, int) else None
    if cls is None:
        raise ProtocolError(f"unknown message tag {tag!r}")
    return cls.from_wire(items[2:])


def topic(frontend_id: str) -> bytes:
    """PUB/SUB topic of a frontend. Ids are fixed-length hex, so no topic prefixes another."""
    return frontend_id.encode("ascii")


MAX_TOP_LOGPROBS = 20  # alternatives per token a request may ask for (OpenAI's limit)


def submit_fault(submit: Submit, n_vocab: int) -> str:
    """What makes a well-typed ``Submit`` unsafe to run, or "". Our frontends never send one
    (they validate first); anything else that reaches the socket must not crash the engine."""
    if submit.max_tokens < 0:  # 0: the prompt's logprobs alone (echo)
        return "max_tokens < 0"
    if not all(0 <= token < n_vocab for token in submit.prompt_ids):
        return "prompt token id outside the vocabulary"
    sampling = submit.sampling
    if not -1 <= sampling.logprobs <= MAX_TOP_LOGPROBS:
        return f"logprobs outside -1..{MAX_TOP_LOGPROBS}"
    if not -1 <= submit.prompt_logprobs <= MAX_TOP_LOGPROBS:
        return f"prompt_logprobs outside -1..{MAX_TOP_LOGPROBS}"
    if not (math.isfinite(sampling.temperature) and 0.0 < sampling.top_p <= 1.0):
        return "temperature or top_p out of range"
    return ""
