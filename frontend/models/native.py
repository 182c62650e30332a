"""The native API: ``POST /generate`` and its replies, ``/health`` and ``/ready``, errors.

``Sampling`` holds the sampling and scheduling fields every generation surface shares (the
OpenAI requests extend it). Replies: one JSON object (``GenerateReply``), or SSE whose events
are text deltas, then exactly one final object (the reply's shape, with ``text`` empty) or a
failure; ``timeline`` is there only when the request asked for it.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, RootModel

from tinyserve.config import Config
from tinyserve.frontend.generation import Generation
from tinyserve.frontend.models.common import (
    Reply,
    Request,
    Text,
    expect,
    is_none,
)
from tinyserve.frontend.models.errors import ErrorDetail
from tinyserve.frontend.models.fields import (
    OutputLength,
    Priority,
    Seed,
    Stop,
    Temperature,
    Tenant,
    TopK,
    TopP,
)

MAX_TOKENS_TEXT = (
    "tokens to generate (--default-max-tokens when absent, at most --max-tokens-limit)"
)


class Sampling(Request):
    """Sampling and scheduling fields of every generation request."""

    stream: bool = Field(False, description="reply as server-sent events")
    temperature: Temperature = Field(0.0, description="0 is greedy")
    top_p: TopP = Field(1.0, description="nucleus sampling")
    top_k: TopK = Field(0, description="0 disables it")
    ignore_eos: bool = Field(False, description="never end at an end-of-generation token")
    seed: Seed | None = Field(None, description="sampling seed; same seed, same text")
    stop: Stop = Field(
        [], description="generation ends before the first of these; the stop string is not returned"
    )
    priority: Priority = Field(0, description="larger is more important (--policy priority)")
    tenant: Tenant = Field("default", description="fairness group")

    def sampling(self) -> dict[str, Any]:
        """These fields as keyword arguments of ``Generation``."""
        return {
            "stream": self.stream,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "ignore_eos": self.ignore_eos,
            "seed": self.seed,
            "stop": self.stop,
            "priority": self.priority,
            "tenant": self.tenant,
        }


class GenerateRequest(Sampling):
    """``POST /generate``."""

    prompt: Annotated[Text, Field(min_length=1), expect("a non-empty string")] = Field(
        description="text to continue; special tokens are parsed"
    )
    max_tokens: OutputLength = Field(None, description=MAX_TOKENS_TEXT)
    timeline: bool = Field(False, description="add the engine's timeline to the final object")

    def generation(self, config: Config) -> Generation:
        """The request with every default resolved."""
        return Generation(
            prompt=self.prompt,
            max_tokens=self.max_tokens or config.default_max_tokens,
            timeline=self.timeline,
            **self.sampling(),
        )


# -- replies -------------------------------------------------------------------------------------


class RequestTimeline(BaseModel):
    """What happened to one request and when (docs/observability.md, Timeline); times are ms
    since its arrival at the frontend. Fields the engine adds later pass through."""

    model_config = ConfigDict(extra="allow")

    request_id: str
    status: Literal["waiting", "running", "finished"]
    tenant: str | None = None
    priority: int | None = None
    prompt_tokens: int | None = None
    admission: dict[str, Any] | None = None
    accepted: dict[str, Any] | None = None
    queue: dict[str, Any] | None = None
    slot: dict[str, Any] | None = None
    prefix_reused_tokens: int | None = None
    prefill: list[dict[str, Any]] | None = None
    first_token_ms: float | None = None
    decode: dict[str, Any] | None = None
    finish: dict[str, Any] | None = None


NativeFinishReason = Literal["stop", "length", "cancelled", "queue_timeout", "timeout"]


class NativeUsage(Reply):
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = Field(description="prompt tokens served from the prefix cache")


class GenerateReply(Reply):
    """The whole output; also the final event of a stream (with ``text`` empty)."""

    id: str
    text: str
    finish_reason: NativeFinishReason
    usage: NativeUsage
    timeline: dict[str, Any] | None = Field(
        default=None, exclude_if=is_none, description="what GET /v1/requests/{id} answers"
    )


class GenerateDelta(Reply):
    """New text of a stream."""

    id: str
    text: str


class GenerateFailure(Reply):
    """The final event of a stream that failed after it started."""

    id: str
    error: ErrorDetail
    finish_reason: Literal["error"] = "error"
    usage: NativeUsage
    timeline: dict[str, Any] | None = Field(
        default=None, exclude_if=is_none, description="what GET /v1/requests/{id} answers"
    )


class GenerateEvent(RootModel[GenerateDelta | GenerateReply | GenerateFailure]):
    """The data of one event of a ``/generate`` stream."""


class Status(Reply):
    status: str
    model: str | None = Field(default=None, exclude_if=is_none)
