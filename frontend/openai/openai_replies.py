"""OpenAI-format reply bodies: completions and chat (whole and as stream chunks), the model
list (errors: ``models.errors``).

A stream chunk's ``usage`` is sent (null but on the last chunk) only when the request asked
for ``stream_options.include_usage``: the reply leaves the field out otherwise. A chat delta
holds only what it carries: ``role`` on the first chunk, ``content`` when there is text,
``reasoning_content`` when there is thinking, ``tool_calls`` as the calls are written.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field

from tinyserve.frontend.models.chat import FinishReason
from tinyserve.frontend.models.common import Reply, is_none
from tinyserve.frontend.models.progress import PromptProgress
from tinyserve.frontend.models.tools import ToolCall
from tinyserve.frontend.models.usage import TokenCounts

PROGRESS_CHUNK_TEXT = "return_progress: the prompt's prefill so far, in a chunk of no choice"


class PromptTokensDetails(Reply):
    cached_tokens: int = Field(description="prompt tokens served from the prefix cache")


class Usage(Reply):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails

    @classmethod
    def of(cls, counts: TokenCounts) -> Usage:
        return cls(
            prompt_tokens=counts.prompt,
            completion_tokens=counts.completion,
            total_tokens=counts.prompt + counts.completion,
            prompt_tokens_details=PromptTokensDetails(cached_tokens=counts.cached),
        )


class CompletionLogprobs(Reply):
    """Each ``top_logprobs`` entry holds the alternatives and the chosen token. With ``echo``
    the prompt's tokens come first; its first token has no logprob (null in both lists)."""

    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class TopLogprob(Reply):
    token: str
    logprob: float
    bytes: list[int]


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(Reply):
    content: list[ChatTokenLogprob]
    refusal: None = None


class CompletionChunkChoice(Reply):
    index: int = 0
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: FinishReason | None


class CompletionChoice(CompletionChunkChoice):
    finish_reason: FinishReason


class FunctionDelta(Reply):
    name: str | None = Field(default=None, exclude_if=is_none)
    arguments: str = Field(description="more of the arguments' JSON text")


class ToolCallDelta(Reply):
    """A streamed tool call, as OpenAI's: its start (``id``, ``type``, the function's
    ``name``) once the name is written, then more of its arguments at the same ``index``."""

    index: int
    id: str | None = Field(default=None, exclude_if=is_none)
    type: Literal["function"] | None = Field(default=None, exclude_if=is_none)
    function: FunctionDelta

    @classmethod
    def start(cls, index: int, call_id: str, name: str, arguments: str = "") -> ToolCallDelta:
        return cls(
            index=index, id=call_id, type="function",
            function=FunctionDelta(name=name, arguments=arguments),
        )  # fmt: skip

    @classmethod
    def more(cls, index: int, arguments: str) -> ToolCallDelta:
        return cls(index=index, function=FunctionDelta(arguments=arguments))


class AssistantMessage(Reply):
    """``content`` is null when the reply is only tool calls (``finish_reason: tool_calls``)."""

    role: Literal["assistant"] = "assistant"
    content: str | None
    reasoning_content: str | None = Field(
        default=None, exclude_if=is_none, description="the model's thinking, when it wrote any"
    )
    tool_calls: list[ToolCall] | None = Field(default=None, exclude_if=is_none)


class ChatChoice(Reply):
    index: int = 0
    message: AssistantMessage
    logprobs: ChatLogprobs | None
    finish_reason: FinishReason


class ChatDelta(Reply):
    role: Literal["assistant"] | None = Field(default=None, exclude_if=is_none)
    content: str | None = Field(default=None, exclude_if=is_none)
    reasoning_content: str | None = Field(default=None, exclude_if=is_none)
    tool_calls: list[ToolCallDelta] | None = Field(default=None, exclude_if=is_none)


class ChatChunkChoice(Reply):
    index: int = 0
    delta: ChatDelta
    logprobs: ChatLogprobs | None
    finish_reason: FinishReason | None


def _usage_may_be_absent(schema: dict[str, Any]) -> None:
    schema["required"].remove("usage")


class Envelope(Reply):
    """What every reply and chunk carries around its choices; ``id`` is the surface's prefix
    and the request id."""

    id: str
    created: int
    model: str


class Completion(Envelope):
    object: Literal["text_completion"] = "text_completion"
    choices: list[CompletionChoice]
    usage: Usage


class CompletionChunk(Envelope):
    model_config = ConfigDict(json_schema_extra=_usage_may_be_absent)

    object: Literal["text_completion"] = "text_completion"
    choices: list[CompletionChunkChoice]
    usage: Usage | None = None
    prompt_progress: PromptProgress | None = Field(
        default=None, exclude_if=is_none, description=PROGRESS_CHUNK_TEXT
    )


class ChatCompletion(Envelope):
    object: Literal["chat.completion"] = "chat.completion"
    choices: list[ChatChoice]
    usage: Usage


class ChatCompletionChunk(Envelope):
    model_config = ConfigDict(json_schema_extra=_usage_may_be_absent)

    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    choices: list[ChatChunkChoice]
    usage: Usage | None = None
    prompt_progress: PromptProgress | None = Field(
        default=None, exclude_if=is_none, description=PROGRESS_CHUNK_TEXT
    )


class Model(Reply):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str
    max_model_len: int = Field(
        description="the most one request (prompt and max_tokens) may fill: one slot's KV cells"
    )
    gpu_layers: int | Literal["all"] = Field(description="model layers offloaded to a GPU")
    sampling_defaults: dict[str, int | float] = Field(
        description="what a request that leaves out temperature, top_k, top_p or min_p gets"
    )
    sampling_defaults_source: dict[str, Literal["flag", "gguf", "built-in"]] = Field(
        description="where each default came from: its --default-* flag, the model's GGUF "
        "general.sampling.* metadata, or the built-in value"
    )


class ModelList(Reply):
    object: Literal["list"] = "list"
    data: list[Model]
