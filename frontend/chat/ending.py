"""How an engine's ending reads in a reply on the surfaces of the chat path (OpenAI's chat
and completions, Responses, Messages): the finish reason of a normal ending, and the error
any other is.

Finish reasons: ``stop`` and ``length`` as they are; ``timeout`` (request time limit),
``cancelled`` and ``deadline_missed`` are output cut short, so ``length``; ``queue_timeout``
(no token made) is a 503 with Retry-After; ``error`` and ``rejected`` are errors, as on
``/generate``. Each surface then says the reason in its own words (a chat reply's
``tool_calls`` is the reply parser's: ``structured.reply_parser``).
"""

from __future__ import annotations

from tinyserve import protocol
from tinyserve.frontend.link.board_view import NodeLoad
from tinyserve.frontend.models.chat import FinishReason
from tinyserve.frontend.models.errors import ApiError
from tinyserve.frontend.request.admission import ending_error
from tinyserve.protocol import RequestUpdate

FINISH_REASONS: dict[str, FinishReason] = {
    protocol.FINISH_STOP: "stop",
    protocol.FINISH_LENGTH: "length",
    protocol.FINISH_TIMEOUT: "length",
    protocol.FINISH_CANCELLED: "length",
    protocol.FINISH_DEADLINE_MISSED: "length",
}


def reply_error(end: RequestUpdate, load: NodeLoad | None) -> ApiError | None:
    """The error an ending is on these surfaces (a queue timeout too: no token was made)."""
    return ending_error(end, load, queue_timeout_refused=True)


def finish_reason(end: RequestUpdate) -> FinishReason:
    """The finish reason of a normal ending (errors go another way)."""
    assert end.finish_reason is not None
    return FINISH_REASONS.get(end.finish_reason, "stop")
