"""The dashboard's event feed on the wire: a frontend's lease on it, and the engine's updates
(``GET /v1/events``). Messages of the protocol like any other (``protocol.py`` lists their
tags); apart because nothing on a request's path reads them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from tinyserve.wire import Message


@dataclass(frozen=True, slots=True)
class FeedLease(Message):
    """A frontend has live viewers of the event feed: the engine produces ``FeedUpdate``s
    for ``seconds`` from now. Renewed while viewers stay, so a frontend that crashed stops
    costing the engine anything once its lease runs out; ``seconds == 0`` ends it now."""

    TAG: ClassVar[int] = 5
    frontend_id: str
    seconds: float


# The feed's topic: frontend ids are hex, so no frontend's topic starts with "~".
FEED_TOPIC = b"~feed"


@dataclass(frozen=True, slots=True)
class FeedUpdate(Message):
    """The node's scheduling state for the event feed, at most one per feed interval (ticks
    that came faster are folded into it), published on ``FEED_TOPIC`` while any lease holds.

    ``ticks``/``batch`` sum the decode calls since the previous update (``window_s``), the
    embedding parts' in ``batch``'s ``embed_*`` figures (tokens, rows, inputs finished,
    seconds; a tick that ran only a part counts in ``ticks``);
    ``events`` are what happened in them (``kind``: grant, finish, reject); ``slots`` is one
    entry per slot (None: free); ``queue`` counts waiting requests by tenant and priority;
    ``kv`` is the block figures at ``at_ns`` (the engine's CLOCK_MONOTONIC); ``policy`` the
    engine's scheduling policy.
    Plain dicts, not nested messages: frontends pass them to viewers as JSON unread.
    """

    TAG: ClassVar[int] = 14
    seq: int
    at_ns: int
    window_s: float
    tick: int
    ticks: int
    batch: dict[str, float]
    slots: list[dict[str, Any] | None]
    queue: list[dict[str, Any]]
    kv: dict[str, int]
    events: list[dict[str, Any]]
    policy: str = ""  # the engine's --policy (frontends do not have it)
    # embedding requests waiting for their first part, counted as ``queue`` counts
    embed_queue: list[dict[str, Any]] = field(default_factory=list)
