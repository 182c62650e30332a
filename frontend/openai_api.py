"""OpenAI-compatible routes: ``GET /v1/models``, ``POST /v1/completions``,
``POST /v1/chat/completions``.

Each parses its body (``openai_schema``), checks the model id against the one the engine
serves, and runs the same pipeline as ``/generate`` with an OpenAI-format reply. Errors under
``/v1/`` take OpenAI's shape (the error middleware decides by path).
"""

from __future__ import annotations

import dataclasses

from aiohttp import web

from tinyserve.frontend import pipeline
from tinyserve.frontend.api_errors import MODEL_NOT_FOUND, ApiError
from tinyserve.frontend.keys import CHAT_TEMPLATE, CONFIG, LINK, TOKENIZER
from tinyserve.frontend.openai_replies import CHAT, COMPLETIONS, OpenAIReply, Surface
from tinyserve.frontend.openai_schema import OpenAIRequest, parse_chat, parse_completion
from tinyserve.frontend.replies import engine_unavailable
from tinyserve.frontend.validation import json_body

OWNED_BY = "tinyserve"


async def list_models(request: web.Request) -> web.Response:
    """The one served model; its id is ``--model-name`` or the model file's name."""
    model = _served_model(request)
    created = int(request.app[TOKENIZER].facts.model_path.stat().st_mtime)
    entry = {"id": model, "object": "model", "created": created, "owned_by": OWNED_BY}
    return web.json_response({"object": "list", "data": [entry]})


async def completions(request: web.Request) -> web.StreamResponse:
    """Continue a prompt (a string or token ids); JSON or SSE."""
    req = parse_completion(await json_body(request), request.app[CONFIG])
    _check_model(request, req.model)
    return await pipeline.run(
        request, req.generate, _reply(request, req, COMPLETIONS), req.prompt_ids
    )


async def chat_completions(request: web.Request) -> web.StreamResponse:
    """Answer a conversation, rendered with the model's own chat template; JSON or SSE."""
    req = parse_chat(await json_body(request), request.app[CONFIG])
    _check_model(request, req.model)
    chat = request.app[CHAT_TEMPLATE].render(
        req.messages,
        add_generation_prompt=req.add_generation_prompt,
        continue_final_message=req.continue_final_message,
    )
    # Tokenized here, in parts: the messages' text must never become control tokens.
    prompt_ids = await request.app[TOKENIZER].tokenize_chat(chat)
    generate = dataclasses.replace(req.generate, prompt=chat.text)
    return await pipeline.run(request, generate, _reply(request, req, CHAT), prompt_ids)


def add_openai_routes(app: web.Application) -> None:
    """Register the OpenAI-compatible routes on ``app``."""
    app.router.add_get("/v1/models", list_models)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat_completions)


def _reply(request: web.Request, req: OpenAIRequest, surface: Surface) -> OpenAIReply:
    tokenizer = request.app[TOKENIZER]
    return OpenAIReply(surface, req.model, req.include_usage, tokenizer, req.generate.logprobs)


def _served_model(request: web.Request) -> str:
    # The engine's word, not our config: it is the one that loaded the model.
    ack = request.app[LINK].ack
    if ack is None:
        raise engine_unavailable()
    return ack.model_name


def _check_model(request: web.Request, model: str) -> None:
    served = _served_model(request)
    if model != served:
        message = f"model {model!r} does not exist; this server serves {served!r}"
        raise ApiError(404, MODEL_NOT_FOUND, message, param="model")
