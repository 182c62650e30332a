"""Reply bodies of ``POST /v1/responses``: a ``Response``, or the events of its stream, in
OpenAI's shapes (platform.openai.com, Responses and its streaming events). Errors before a
stream: ``models.errors.OpenAIError``; after its start, a ``response.failed`` event."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, RootModel

from tinyserve.frontend.models.common import Reply
from tinyserve.frontend.models.progress import PromptProgress
from tinyserve.frontend.models.usage import TokenCounts

ResponseStatus = Literal["in_progress", "completed", "incomplete", "failed"]
ItemStatus = Literal["in_progress", "completed", "incomplete"]


class InputTokensDetails(Reply):
    cached_tokens: int = Field(description="prompt tokens served from the prefix cache")
    cache_write_tokens: int = Field(default=0, description="always 0: caching costs nothing extra")


class OutputTokensDetails(Reply):
    reasoning_tokens: int = 0


class ResponsesUsage(Reply):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails = OutputTokensDetails()
    total_tokens: int

    @classmethod
    def of(cls, counts: TokenCounts) -> ResponsesUsage:
        return cls(
            input_tokens=counts.prompt,
            input_tokens_details=InputTokensDetails(cached_tokens=counts.cached),
            output_tokens=counts.completion,
            total_tokens=counts.prompt + counts.completion,
        )


class OutputTextContent(Reply):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = Field(default=[], description="always empty")
    logprobs: list[Any] = Field(default=[], description="always empty")


class OutputMessage(Reply):
    type: Literal["message"] = "message"
    id: str
    role: Literal["assistant"] = "assistant"
    status: ItemStatus
    content: list[OutputTextContent]


class FunctionToolCall(Reply):
    type: Literal["function_call"] = "function_call"
    id: str
    call_id: str = Field(description="what its function_call_output names")
    name: str
    arguments: str = Field(description="the arguments as JSON text")
    status: ItemStatus


class ReasoningText(Reply):
    type: Literal["reasoning_text"] = "reasoning_text"
    text: str


class ReasoningItem(Reply):
    """The model's thinking before its answer (as open-weight reasoning models return it:
    the text itself, no summary, nothing encrypted)."""

    type: Literal["reasoning"] = "reasoning"
    id: str
    summary: list[Any] = Field(default=[], description="always empty")
    content: list[ReasoningText]
    status: ItemStatus


OutputItem = ReasoningItem | OutputMessage | FunctionToolCall


class EchoedTool(Reply):
    """A function tool of the request, as the response repeats it."""

    type: Literal["function"] = "function"
    name: str
    description: str | None
    parameters: dict[str, Any] | None
    strict: bool


class ResponseError(Reply):
    code: str = Field(description="server_error")
    message: str
    type: str = Field(description="this server's precise error type")


class IncompleteDetails(Reply):
    reason: Literal["max_output_tokens"]


class Response(Reply):
    """The whole reply; in a stream's lifecycle events, as it stands then."""

    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: ResponseStatus
    model: str
    output: list[OutputItem]
    error: ResponseError | None = None
    incomplete_details: IncompleteDetails | None = None
    instructions: str | None
    max_output_tokens: int
    parallel_tool_calls: bool
    temperature: float
    top_p: float
    tool_choice: Any = Field(description="as the request gave it (auto when it did not)")
    tools: list[EchoedTool]
    text: dict[str, Any] = Field(description="the output's format, as the request gave it")
    store: Literal[False] = False
    usage: ResponsesUsage | None = Field(description="null until the response is done")


# -- stream events --------------------------------------------------------------------------------


class _Event(Reply):
    type: str
    sequence_number: int


class Lifecycle(_Event):
    """``response.created``, ``response.in_progress``; at the end one of
    ``response.completed``, ``response.incomplete`` and ``response.failed``."""

    type: Literal[
        "response.created",
        "response.in_progress",
        "response.completed",
        "response.incomplete",
        "response.failed",
    ]
    response: Response


class OutputItemEvent(_Event):
    """``response.output_item.added`` (the item as it starts) and ``.done`` (as it ended)."""

    type: Literal["response.output_item.added", "response.output_item.done"]
    output_index: int
    item: OutputItem


class ContentPartEvent(_Event):
    type: Literal["response.content_part.added", "response.content_part.done"]
    item_id: str
    output_index: int
    content_index: int
    part: OutputTextContent


class OutputTextDelta(_Event):
    type: Literal["response.output_text.delta"] = "response.output_text.delta"
    item_id: str
    output_index: int
    content_index: int
    delta: str
    logprobs: list[Any] = Field(default=[], description="always empty")


class OutputTextDone(_Event):
    type: Literal["response.output_text.done"] = "response.output_text.done"
    item_id: str
    output_index: int
    content_index: int
    text: str
    logprobs: list[Any] = Field(default=[], description="always empty")


class ReasoningTextDelta(_Event):
    type: Literal["response.reasoning_text.delta"] = "response.reasoning_text.delta"
    item_id: str
    output_index: int
    content_index: int
    delta: str


class ReasoningTextDone(_Event):
    type: Literal["response.reasoning_text.done"] = "response.reasoning_text.done"
    item_id: str
    output_index: int
    content_index: int
    text: str


class ArgumentsDelta(_Event):
    """More of a function call's arguments, as the model writes them."""

    type: Literal["response.function_call_arguments.delta"] = (
        "response.function_call_arguments.delta"
    )
    item_id: str
    output_index: int
    delta: str


class ArgumentsDone(_Event):
    type: Literal["response.function_call_arguments.done"] = "response.function_call_arguments.done"
    item_id: str
    output_index: int
    name: str
    arguments: str


class ResponsesProgress(_Event):
    """The prompt's prefill so far (``return_progress``, an extension)."""

    type: Literal["response.prompt_progress"] = "response.prompt_progress"
    prompt_progress: PromptProgress


class ResponsesEvent(
    RootModel[
        Lifecycle
        | OutputItemEvent
        | ContentPartEvent
        | OutputTextDelta
        | OutputTextDone
        | ReasoningTextDelta
        | ReasoningTextDone
        | ArgumentsDelta
        | ArgumentsDone
        | ResponsesProgress
    ]
):
    """The data of one event of a ``/v1/responses`` stream; its ``event:`` line is its
    ``type``."""
