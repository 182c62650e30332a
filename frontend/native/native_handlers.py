"""The native surface's handlers: ``POST /generate``, ``GET /health``, ``GET /ready``
(``http.routes`` lists every route).

``/generate`` parses its body and runs the shared pipeline (``pipeline.run``: tokenize ->
admit -> submit -> wait for the engine's first word -> reply) with the native reply format.
"""

from __future__ import annotations

from aiohttp import web

from tinyserve.frontend.http.appkeys import CONFIG, LINK
from tinyserve.frontend.models.common import json_response
from tinyserve.frontend.models.native import GenerateRequest, Status
from tinyserve.frontend.models.parse import json_body, parse_body
from tinyserve.frontend.native.native_reply import native_reply
from tinyserve.frontend.request import admission, pipeline
from tinyserve.frontend.request.reply_common import engine_unavailable, rejection_error
from tinyserve.frontend.structured.constraints import constrained


async def health(request: web.Request) -> web.Response:
    """200 while the process runs, whatever the engine's state."""
    return json_response(Status(status="ok"))


async def ready(request: web.Request) -> web.Response:
    """200 once a request reaching this port would be served (``EngineLink.unready_reason``)
    and the engine is not draining."""
    link = request.app[LINK]
    unready, ack, load = link.unready_reason(), link.ack, link.load()
    if unready is not None or ack is None or load is None:
        raise engine_unavailable(unready or "engine board unreadable")
    if load.draining:
        raise rejection_error(admission.engine_rejection(admission.REASON_DRAINING, load))
    return json_response(Status(status="ready", model=ack.model_name))


async def generate(request: web.Request) -> web.StreamResponse:
    """Generate a completion for one prompt; JSON or SSE as the request asks."""
    config = request.app[CONFIG]
    req = parse_body(await json_body(request), GenerateRequest, config)
    generation = await constrained(request, req.generation(config), req.constraint())
    return await pipeline.run(request, generation, native_reply)
