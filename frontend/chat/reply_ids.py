"""The ids OpenAI's replies give a request: its surface's prefix and the request id. Native's
``GET /v1/requests/{id}`` takes them as well as the request id itself."""

from __future__ import annotations

CHAT_ID_PREFIX = "chatcmpl-"
COMPLETION_ID_PREFIX = "cmpl-"


def request_id_of(reply_id: str) -> str:
    """The request id that ``reply_id`` names: itself, or an OpenAI reply's id without its
    surface's prefix."""
    for prefix in (CHAT_ID_PREFIX, COMPLETION_ID_PREFIX):
        reply_id = reply_id.removeprefix(prefix)
    return reply_id
