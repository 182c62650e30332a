"""The event feed's bodies as JSON Schema, for ``/openapi.json`` (the hub writes them)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, RootModel


class FeedHello(BaseModel):
    """``event: hello``, first on every stream: the node's shape."""

    model: str
    slots: int
    blocks_total: int
    block_size: int
    n_ctx: int
    max_queue: int
    interval_ms: int = Field(description="the shortest time between two updates")


class SlotState(BaseModel):
    """What one slot holds (``null`` in ``slots`` when it is free)."""

    request_id: str
    tenant: str
    priority: int
    phase: Literal["prefill", "decode"]
    n_past: int = Field(description="tokens of the request in the KV cache")
    prompt_tokens: int
    cached_tokens: int = Field(description="prompt tokens the prefix cache gave it")
    generated: int
    max_tokens: int


class QueueGroup(BaseModel):
    """Waiting requests of one tenant and priority."""

    tenant: str
    priority: int
    count: int


class FeedUpdateBody(BaseModel):
    """``event: update``: the ticks since the previous update and the state now."""

    seq: int = Field(description="counts this engine's updates; a gap means some were cut")
    at_ms: float = Field(description="the engine's monotonic clock")
    window_s: float = Field(description="time the ticks and events cover")
    tick: int = Field(description="the engine's tick counter")
    ticks: int = Field(description="ticks in the window (a decode, an embedding part or both)")
    batch: dict[str, float] = Field(
        description="sums over the window: tokens, prefill_tokens, decode_tokens, decode_s, "
        "generated; the embedding parts' embed_tokens, embed_rows, embed_inputs (finished), "
        "embed_s; requests: the largest batch; events_dropped when over the bound"
    )
    slots: list[SlotState | None]
    queue: list[QueueGroup]
    kv: dict[str, int] = Field(description="KV blocks: total, used, cached, free")
    events: list[dict[str, Any]] = Field(
        description="kind grant (request_id, tenant, priority, rule, wait_ms), finish "
        "(reason, cause, slot, prompt_tokens, cached_tokens, generated, wait_ms, ttft_ms, "
        "itl_ms) or reject (reason, stage); each with its tick"
    )
    policy: str = Field(description="the engine's scheduling policy (--policy)")
    embed_queue: list[QueueGroup] = Field(
        description="embedding requests waiting for their first part, as queue counts"
    )


class FeedEnd(BaseModel):
    """``event: end``, last: why the stream ends."""

    reason: Literal["draining", "slow_viewer", "engine_gone"]


class FeedEvent(RootModel[FeedHello | FeedUpdateBody | FeedEnd]):
    """The data of one event of ``GET /v1/events`` (the ``event:`` field names which)."""


class Page(RootModel[str]):
    root: str = Field(description="the dashboard's HTML page")


class Asset(RootModel[str]):
    root: str = Field(description="dashboard.js or dashboard.css")
