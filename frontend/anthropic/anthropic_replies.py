"""Reply bodies of ``POST /v1/messages`` (an ``AnthropicMessage``, Anthropic's ``Message``, or
the events of its stream) and ``POST /v1/messages/count_tokens``, in Anthropic's shapes
(docs.anthropic.com, Messages and Streaming Messages). Errors: ``models.errors.AnthropicError``."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, RootModel

from tinyserve.frontend.models.common import Reply
from tinyserve.frontend.models.errors import AnthropicError
from tinyserve.frontend.models.progress import PromptProgress
from tinyserve.frontend.models.usage import TokenCounts

StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use", "pause_turn"]


class AnthropicUsage(Reply):
    """The prompt is ``input_tokens`` + ``cache_read_input_tokens`` (+ the cache creation,
    always 0 here: caching a prefix costs nothing extra)."""

    input_tokens: int = Field(description="prompt tokens not served from the prefix cache")
    output_tokens: int
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = Field(description="prompt tokens served from the prefix cache")

    @classmethod
    def of(cls, counts: TokenCounts) -> AnthropicUsage:
        return cls(
            input_tokens=counts.prompt - counts.cached,
            output_tokens=counts.completion,
            cache_read_input_tokens=counts.cached,
        )


class TextContent(Reply):
    type: Literal["text"] = "text"
    text: str


class ThinkingContent(Reply):
    """The model's thinking before its answer. ``signature`` is opaque: clients send the
    block back as it came, and this server reads no signature."""

    type: Literal["thinking"] = "thinking"
    thinking: str
    signature: str


class ToolUseContent(Reply):
    type: Literal["tool_use"] = "tool_use"
    id: str
    name: str
    input: dict[str, Any]


ContentBlock = ThinkingContent | TextContent | ToolUseContent


class AnthropicMessage(Reply):
    """The whole reply; also, empty and without a stop reason, a stream's ``message_start``."""

    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    model: str
    content: list[ContentBlock]
    stop_reason: StopReason | None
    stop_sequence: str | None = Field(description="the stop sequence that ended the reply")
    usage: AnthropicUsage


class MessageStart(Reply):
    type: Literal["message_start"] = "message_start"
    message: AnthropicMessage


class ContentBlockStart(Reply):
    type: Literal["content_block_start"] = "content_block_start"
    index: int
    content_block: ContentBlock = Field(description="empty: its content follows in deltas")


class TextDelta(Reply):
    type: Literal["text_delta"] = "text_delta"
    text: str


class ThinkingDelta(Reply):
    type: Literal["thinking_delta"] = "thinking_delta"
    thinking: str


class SignatureDelta(Reply):
    """Closes a thinking block."""

    type: Literal["signature_delta"] = "signature_delta"
    signature: str


class InputJsonDelta(Reply):
    type: Literal["input_json_delta"] = "input_json_delta"
    partial_json: str = Field(description="more of a tool's input, as the model writes it")


class ContentBlockDelta(Reply):
    type: Literal["content_block_delta"] = "content_block_delta"
    index: int
    delta: TextDelta | ThinkingDelta | SignatureDelta | InputJsonDelta


class ContentBlockStop(Reply):
    type: Literal["content_block_stop"] = "content_block_stop"
    index: int


class StopInfo(Reply):
    stop_reason: StopReason
    stop_sequence: str | None


class MessageDelta(Reply):
    type: Literal["message_delta"] = "message_delta"
    delta: StopInfo
    usage: AnthropicUsage = Field(description="the totals, the input's split by the cache")


class MessageStop(Reply):
    type: Literal["message_stop"] = "message_stop"


class Ping(Reply):
    """Sent while the reply has nothing new (--sse-ping-interval)."""

    type: Literal["ping"] = "ping"


class MessagesProgress(Reply):
    """The prompt's prefill so far (``return_progress``, an extension: event
    ``prompt_progress``)."""

    type: Literal["prompt_progress"] = "prompt_progress"
    prompt_progress: PromptProgress


class MessagesEvent(
    RootModel[
        MessageStart
        | ContentBlockStart
        | ContentBlockDelta
        | ContentBlockStop
        | MessageDelta
        | MessageStop
        | Ping
        | MessagesProgress
        | AnthropicError
    ]
):
    """The data of one event of a ``/v1/messages`` stream; its ``event:`` line is its
    ``type``."""


class TokenCount(Reply):
    input_tokens: int = Field(description="the prompt tokens the same messages request uses")
