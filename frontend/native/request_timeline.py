"""``GET /v1/requests/{request_id}``: the timeline of a recent request, from the engine.

Timelines live in the engine (the last ``--timeline-keep`` finished requests, and every
request still in flight), so any frontend answers for any request, whichever frontend served
it: behind nginx the GET lands on a random one. An OpenAI reply's id (``cmpl-``/``chatcmpl-``
and the request id) works as well. The frontend asks with a ``TimelineQuery`` and
waits at most ``QUERY_TIMEOUT_S`` for the ``TimelineReply``.
"""

from __future__ import annotations

from aiohttp import web

from tinyserve.frontend.chat.reply_ids import request_id_of
from tinyserve.frontend.link.engine_client import EngineUnreachable
from tinyserve.frontend.models.common import json_response
from tinyserve.frontend.models.errors import NOT_FOUND, ApiError
from tinyserve.frontend.native.native_bodies import RequestTimeline
from tinyserve.frontend.request.admission import no_engine, serving
from tinyserve.frontend.request.state import CLIENT, LINK

# The engine answers between ticks, and a loaded engine's tick can pass a second (a full
# prefill chunk on a busy machine): 1 s gave the dashboard's clicks 503s under load.
QUERY_TIMEOUT_S = 3.0


async def request_timeline(request: web.Request) -> web.Response:
    """The timeline of a request still in flight or among the engine's recent ones."""
    request_id = request_id_of(request.match_info["request_id"])
    serving(request.app[LINK])
    try:
        timeline = await request.app[CLIENT].timeline(request_id, QUERY_TIMEOUT_S)
    except (EngineUnreachable, TimeoutError) as exc:
        raise no_engine("the engine did not answer the timeline query") from exc
    if timeline is None:
        raise ApiError(404, NOT_FOUND, f"no recent request with id {request_id!r}")
    return json_response(RequestTimeline.model_validate(timeline))
