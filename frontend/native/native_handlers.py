"""The native surface's handlers: ``POST /generate``, and the node's ``GET /health``,
``GET /ready`` and ``GET /metrics`` (``http.routes`` lists every route).

``/generate`` parses its body, translates it into a ``Generation`` and runs the shared
pipeline (``pipeline.run``: tokenize -> admit -> submit -> wait for the engine's first word
-> reply) with the native reply format.
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from tinyserve.config import Config
from tinyserve.frontend.models.common import json_response
from tinyserve.frontend.models.parse import read_body
from tinyserve.frontend.native.native_bodies import GenerateRequest, HealthReply
from tinyserve.frontend.native.native_reply import NativeReply
from tinyserve.frontend.request import admission, pipeline
from tinyserve.frontend.request.generation import Generation, constrained, resolved
from tinyserve.frontend.request.state import CONFIG, LINK, METRICS
from tinyserve.frontend.structured.constraints import Constraint
from tinyserve.metrics import CONTENT_TYPE


async def health(request: web.Request) -> web.Response:
    """200 while the process runs, whatever the engine's state."""
    return json_response(HealthReply(status="ok"))


async def ready(request: web.Request) -> web.Response:
    """200 once a request reaching this port would be served (``EngineLink.unready_reason``)
    and the engine is not draining."""
    link = request.app[LINK]
    unready, ack, load = link.unready_reason(), link.ack, link.load()
    if unready is not None or ack is None or load is None:
        raise admission.no_engine(unready or "engine board unreadable")
    if load.draining:
        raise admission.engine_draining(load)
    return json_response(HealthReply(status="ready", model=ack.model_name))


async def metrics(request: web.Request) -> web.Response:
    """The node's metrics: engine and every frontend, merged from their files."""
    # Reading every process's files takes milliseconds: off the event loop, between streams.
    body = await asyncio.to_thread(request.app[METRICS].process.render)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


async def generate(request: web.Request) -> web.StreamResponse:
    """Generate a completion for one prompt; JSON or SSE as the request asks."""
    config = request.app[CONFIG]
    req = await read_body(request, GenerateRequest, config)
    generation = await constrained(request, generation_of(req, config), constraint_of(req))
    return await pipeline.run(request, generation, NativeReply())


def constraint_of(req: GenerateRequest) -> Constraint:
    """``/generate``'s constraint: ``grammar`` or ``json_schema`` (or nothing)."""
    if req.json_schema is not None:
        return Constraint("json_schema", schema=req.json_schema)
    return Constraint("grammar", grammar=req.grammar)


def generation_of(req: GenerateRequest, config: Config) -> Generation:
    """``/generate``'s request with every default resolved."""
    prompt_logprobs = -1 if req.prompt_logprobs is None else req.prompt_logprobs
    max_tokens = req.max_tokens or config.default_max_tokens
    return resolved(
        req, max_tokens=max_tokens, max_tokens_asked=req.max_tokens is not None,
        prompt_logprobs=prompt_logprobs,
    )  # fmt: skip
