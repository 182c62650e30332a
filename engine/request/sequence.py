"""One request's life inside the engine, from acceptance to its final update."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from tinyserve.engine.request.speculation import Speculation
from tinyserve.engine.request.stops import StopMatcher
from tinyserve.engine.request.timeline import Timeline
from tinyserve.protocol import Submit


class SequenceStatus(enum.Enum):
    NEW = "new"  # being accepted: not in the policy's queue yet
    WAITING = "waiting"  # accepted, no slot yet
    PREFILL = "prefill"  # holds a slot, prompt not fully in its cells
    DECODE = "decode"  # generating one token per tick
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    """Engine-side state of one request. Identity equality: each object is one request."""

    request: Submit
    order: int = 0  # arrival order at the engine, the FIFO tie-breaker
    status: SequenceStatus = SequenceStatus.NEW
    slot: int = -1
    n_past: int = 0  # tokens of this sequence in its slot's cells
    last_token: int = -1
    output_ids: list[int] = field(default_factory=list)
    cache_hint: int = 0  # prompt tokens the prefix cache held at acceptance (for SRPT)
    stops: StopMatcher = field(init=False)
    timeline: Timeline = field(init=False)
    policy_name: str = ""
    # n > 1 (engine/kv/forks.py): the choice whose prefill this one waits to copy, and the
    # choices waiting on this one's.
    leader: Sequence | None = None
    followers: list[Sequence] = field(default_factory=list)
    spec: Speculation | None = None  # its guessing, once it decodes (engine/request/speculation.py)

    def __post_init__(self) -> None:
        self.stops = StopMatcher(self.request.sampling.stop)
        self.timeline = Timeline(self.request, self.policy_name)

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def prompt_len(self) -> int:
        return len(self.request.prompt_ids)

    @property
    def generated(self) -> int:
        """Tokens generated so far: the one count of them."""
        return len(self.output_ids)

    def kv_tokens(self) -> list[int]:
        """The tokens whose KV this sequence's slot holds (the last sampled one never is)."""
        return (self.request.prompt_ids + self.output_ids)[: self.n_past]

    @property
    def prefill_left(self) -> int:
        """Prompt tokens still to decode: none while waiting for a leader's prefill."""
        if self.status is not SequenceStatus.PREFILL or self.leader is not None:
            return 0
        return self.prompt_len - self.n_past
