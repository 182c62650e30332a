"""The native API: ``POST /generate`` and its replies, ``/health`` and ``/ready``, errors.

Replies: one JSON object (``GenerateReply``), or SSE whose events
are text deltas, then exactly one final object (the reply's shape, with ``text`` empty) or a
failure; ``timeline`` is there only when the request asked for it.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, RootModel, model_validator

from tinyserve.frontend.models.common import Reply, Text, cross_field, expect, is_none, schema_rule
from tinyserve.frontend.models.errors import ErrorDetail
from tinyserve.frontend.models.fields import MAX_TOKENS_TEXT, LogprobCount, OutputLength, Sampling
from tinyserve.frontend.models.progress import PromptProgress
from tinyserve.frontend.models.usage import TokenCounts


class GenerateRequest(Sampling):
    """``POST /generate``."""

    # As the validator below: a JSON schema and a grammar exclude each other.
    model_config = ConfigDict(
        json_schema_extra=schema_rule(
            "json_schema", {"type": "object"}, {"grammar": {"enum": ["", None]}}, required=False
        )
    )

    prompt: Annotated[Text, Field(min_length=1), expect("a non-empty string")] = Field(
        description="text to continue; special tokens are parsed"
    )
    max_tokens: OutputLength = Field(None, description=MAX_TOKENS_TEXT)
    timeline: bool = Field(False, description="add the engine's timeline to the final object")
    prompt_logprobs: LogprobCount | None = Field(
        None,
        description="add the logprob of every prompt token (the first has none) and this many "
        "alternatives each to the final object",
    )
    json_schema: dict[str, Any] | None = Field(
        None, description="JSON schema the output follows (a grammar is built from it)"
    )

    @model_validator(mode="after")
    def _one_constraint(self) -> Self:
        if self.grammar and self.json_schema is not None:
            raise cross_field("json_schema", "'grammar' and 'json_schema' exclude each other")
        return self


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
    prompt_from: dict[str, int] | None = None
    prefill: list[dict[str, Any]] | None = None
    first_token_ms: float | None = None
    decode: dict[str, Any] | None = None
    finish: dict[str, Any] | None = None
    # Only in some timelines (a constrained request, a fork, prompt logprobs, a prefix the
    # cache wrote into the slot, guessed tokens): left out when absent, as in the final
    # event's copy.
    grammar: dict[str, Any] | None = Field(None, exclude_if=is_none)
    shared_prefill: dict[str, Any] | None = Field(None, exclude_if=is_none)
    prefix_recomputed_tokens: int | None = Field(None, exclude_if=is_none)
    restore: dict[str, Any] | None = Field(None, exclude_if=is_none)
    speculation: dict[str, Any] | None = Field(None, exclude_if=is_none)


NativeFinishReason = Literal[
    "stop", "length", "cancelled", "queue_timeout", "timeout", "deadline_missed"
]


class NativeUsage(Reply):
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = Field(description="prompt tokens served from the prefix cache")

    @classmethod
    def of(cls, counts: TokenCounts) -> NativeUsage:
        return cls(
            prompt_tokens=counts.prompt,
            completion_tokens=counts.completion,
            cached_tokens=counts.cached,
        )


class _Final(Reply):
    id: str
    usage: NativeUsage
    timeline: dict[str, Any] | None = Field(
        default=None, exclude_if=is_none, description="what GET /v1/requests/{id} answers"
    )


class NativeTokenLogprob(Reply):
    token_id: int
    logprob: float


class PromptTokenLogprob(NativeTokenLogprob):
    top_logprobs: list[NativeTokenLogprob] = Field(description="the likeliest tokens, best first")


class GenerateReply(_Final):
    """The whole output; also the final event of a stream (with ``text`` empty)."""

    text: str
    finish_reason: NativeFinishReason
    prompt_logprobs: list[PromptTokenLogprob | None] | None = Field(
        default=None,
        exclude_if=is_none,
        description="when asked: one per prompt token, null for the first (nothing precedes it)",
    )


class GenerateDelta(Reply):
    """New text of a stream."""

    id: str
    text: str


class GenerateProgress(Reply):
    """The prompt's prefill so far, before the first token (``return_progress``)."""

    id: str
    prompt_progress: PromptProgress


class GenerateFailure(_Final):
    """The final event of a stream that failed after it started."""

    error: ErrorDetail
    finish_reason: Literal["error"] = "error"


class GenerateEvent(RootModel[GenerateDelta | GenerateProgress | GenerateReply | GenerateFailure]):
    """The data of one event of a ``/generate`` stream."""


class HealthReply(Reply):
    status: str
    model: str | None = Field(default=None, exclude_if=is_none)
