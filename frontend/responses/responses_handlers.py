"""OpenAI's Responses API: ``POST /v1/responses``, stateless.

A request is translated into the equivalent conversation (``responses_requests``) and served
by the same path as ``/v1/chat/completions``: the chat template, tool prompts and grammars,
``text.format`` as a ``response_format``, sampling defaults, admission, tenants and
priorities, the pipeline; only the reply is the Responses API's (``responses_reply``).
Nothing is kept: ``previous_response_id`` is a 400 (the client sends the whole conversation,
as with ``store: false``). Errors take OpenAI's shape.
"""

from __future__ import annotations

import dataclasses

from aiohttp import web

from tinyserve.frontend.chat.chat_generation import chat_generation, served_model
from tinyserve.frontend.models.parse import read_body
from tinyserve.frontend.request import pipeline
from tinyserve.frontend.request.state import CONFIG
from tinyserve.frontend.responses.responses_reply import ResponsesReply
from tinyserve.frontend.responses.responses_requests import ResponsesRequest


async def responses(request: web.Request) -> web.StreamResponse:
    """Answer an input in the Responses API's shapes; JSON or SSE."""
    req = await read_body(request, ResponsesRequest, request.app[CONFIG])
    model = served_model(request, req.model)
    generation, parser = await chat_generation(request, req.turn())
    if req.max_output_tokens is None:  # an agent's turn: until the model stops or fills
        limit = request.app[CONFIG].max_tokens_limit
        generation = dataclasses.replace(generation, max_tokens=limit, max_tokens_asked=False)
    reply = ResponsesReply(req, model, generation, parser)
    return await pipeline.run(request, generation, reply)
