"""HTTP routes: ``POST /generate``, ``GET /health``, ``GET /ready``; ``add_routes`` also
registers the OpenAI-compatible routes (``openai_api``), ``GET /openapi.json`` and
``GET /metrics`` (``meters``) and ``GET /v1/requests/{id}`` (``timelines``).

``/generate`` parses its body and runs the shared pipeline (``pipeline.run``: tokenize ->
admit -> submit -> wait for the engine's first word -> reply) with the native reply format.
"""

from __future__ import annotations

from aiohttp import web

from tinyserve.frontend import admission, pipeline
from tinyserve.frontend.keys import CONFIG, LINK
from tinyserve.frontend.meters import add_metrics_route
from tinyserve.frontend.models.common import json_response
from tinyserve.frontend.models.native import GenerateRequest, Status
from tinyserve.frontend.models.parse import json_body, parse_body
from tinyserve.frontend.openai_api import add_openai_routes
from tinyserve.frontend.openapi import add_openapi_route
from tinyserve.frontend.replies import engine_unavailable, native_reply, rejection_error
from tinyserve.frontend.timelines import add_timeline_route


async def health(request: web.Request) -> web.Response:
    """200 while the process runs, whatever the engine's state."""
    return json_response(Status(status="ok"))


async def ready(request: web.Request) -> web.Response:
    """200 once the engine handshake is done and the engine is alive and not draining."""
    link = request.app[LINK]
    ack, load = link.ack, link.load()
    if ack is None or load is None:
        raise engine_unavailable("engine handshake not done or engine down")
    if load.draining:
        raise rejection_error(admission.engine_rejection(admission.REASON_DRAINING, load))
    return json_response(Status(status="ready", model=ack.model_name))


async def generate(request: web.Request) -> web.StreamResponse:
    """Generate a completion for one prompt; JSON or SSE as the request asks."""
    config = request.app[CONFIG]
    req = parse_body(await json_body(request), GenerateRequest, config)
    return await pipeline.run(request, req.generation(config), native_reply)


def add_routes(app: web.Application) -> None:
    """Register the frontend's routes on ``app``."""
    app.router.add_post("/generate", generate)
    app.router.add_get("/health", health)
    app.router.add_get("/ready", ready)
    add_openai_routes(app)
    add_openapi_route(app)
    add_timeline_route(app)
    add_metrics_route(app)
