"""One request's life inside the engine, from acceptance to its final update."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from tinyserve.engine.prefix_cache import NO_HIT, Hit
from tinyserve.engine.stops import StopMatcher
from tinyserve.engine.timeline import Timeline
from tinyserve.protocol import Submit


class Status(enum.Enum):
    NEW = "new"  # being accepted: holds only the blocks in ``blocks``, not in the policy yet
    BLOCKED = "blocked"  # accepted, waiting for KV blocks to free up: holds none, no policy
    WAITING = "waiting"  # accepted, blocks reserved, no slot yet
    PREFILL = "prefill"  # holds a slot, prompt not fully in the KV cache
    DECODE = "decode"  # generating one token per tick
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    """Engine-side state of one request. Identity equality: each object is one request."""

    request: Submit
    blocks: list[int]
    order: int  # arrival order at the engine, the FIFO tie-breaker
    status: Status = Status.WAITING
    slot: int = -1
    n_past: int = 0  # tokens of this sequence already in the KV cache
    last_token: int = -1
    generated: int = 0
    output_ids: list[int] = field(default_factory=list)
    hit: Hit = NO_HIT  # prefix-cache blocks reused: the first entries of ``blocks``
    blocked_ns: int = 0  # when it began to wait for KV blocks (Status.BLOCKED)
    stops: StopMatcher = field(init=False)
    timeline: Timeline = field(init=False)
    policy_name: str = ""
    # n > 1 (engine/forks.py): the choice whose prefill this one waits to copy, and the
    # choices waiting on this one's.
    leader: Sequence | None = None
    followers: list[Sequence] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.stops = StopMatcher(self.request.sampling.stop)
        self.timeline = Timeline(self.request, self.policy_name)

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def prompt_len(self) -> int:
        return len(self.request.prompt_ids)

    def kv_tokens(self) -> list[int]:
        """The tokens whose KV this sequence's slot holds (the last sampled one never is)."""
        return (self.request.prompt_ids + self.output_ids)[: self.n_past]

    @property
    def prefill_left(self) -> int:
        """Prompt tokens still to decode: none while waiting for a leader's prefill."""
        if self.status is not Status.PREFILL or self.leader is not None:
            return 0
        return self.prompt_len - self.n_past
