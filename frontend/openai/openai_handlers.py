"""OpenAI-compatible routes: ``GET /v1/models`` (and ``/v1/models/{model}``),
``POST /v1/completions``, ``POST /v1/chat/completions``.

Each parses its body into its model (``models.openai_requests``, ``models.chat``), checks the
model id against the one the engine serves, and runs the same pipeline as ``/generate`` with
an OpenAI-format reply. Errors under ``/v1/`` take OpenAI's shape (the error middleware
decides by path).
"""

from __future__ import annotations

import dataclasses

from aiohttp import web

from tinyserve.frontend.http.api_errors import MODEL_NOT_FOUND, ApiError
from tinyserve.frontend.http.appkeys import CHAT_TEMPLATE, CONFIG, LINK, TOKENIZER
from tinyserve.frontend.models.chat import ChatCompletionRequest
from tinyserve.frontend.models.common import json_response
from tinyserve.frontend.models.openai_reply_bodies import Model, ModelList
from tinyserve.frontend.models.openai_requests import CompletionRequest, OpenAIRequest
from tinyserve.frontend.models.parse import json_body, parse_body
from tinyserve.frontend.openai import choices
from tinyserve.frontend.openai.openai_reply import CHAT, COMPLETIONS, OpenAIReply, Surface
from tinyserve.frontend.request import pipeline
from tinyserve.frontend.request.generation import Generation, check_token_ids
from tinyserve.frontend.request.reply_common import engine_unavailable
from tinyserve.frontend.request.sampling_defaults import (
    SamplingDefaults,
    sampling_defaults,
    with_defaults,
)
from tinyserve.frontend.structured.constraints import constrained
from tinyserve.frontend.structured.reply_parser import ReplyParser
from tinyserve.protocol import HelloAck

OWNED_BY = "tinyserve"


async def list_models(request: web.Request) -> web.Response:
    """The one served model; its id is ``--model-name`` or the model file's name."""
    return json_response(ModelList(data=[_model_entry(request)]))


async def retrieve_model(request: web.Request) -> web.Response:
    """The served model by its id (the openai client's ``models.retrieve``); another id is
    a 404."""
    check_model(request, request.match_info["model"])
    return json_response(_model_entry(request))


def _model_entry(request: web.Request) -> Model:
    created = int(request.app[TOKENIZER].facts.model_path.stat().st_mtime)
    defaults = _defaults(request)
    ack = _engine_ack(request)
    return Model(
        id=ack.model_name,
        created=created,
        owned_by=OWNED_BY,
        max_model_len=ack.n_ctx,
        gpu_layers="all" if ack.gpu_layers < 0 else ack.gpu_layers,
        sampling_defaults=defaults.values,
        sampling_defaults_source=defaults.sources,
    )


async def completions(request: web.Request) -> web.StreamResponse:
    """Continue a prompt (a string or token ids); JSON or SSE."""
    config = request.app[CONFIG]
    req = parse_body(await json_body(request), CompletionRequest, config)
    check_model(request, req.model)
    generation = with_defaults(req.generation(config), req, _defaults(request))
    generation = await constrained(request, generation, req.constraint())
    reply = _reply(request, req, COMPLETIONS, generation.sampling.logprobs)
    return await _complete(request, req, generation, reply)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    """Answer a conversation, rendered with the model's own chat template; JSON or SSE."""
    config = request.app[CONFIG]
    req = parse_body(await json_body(request), ChatCompletionRequest, config)
    check_model(request, req.model)
    generation, prompt_ids, parser = await chat_generation(request, req)
    reply = _reply(request, req, CHAT, generation.sampling.logprobs)
    reply.parser = parser
    if req.n > 1:
        plan = choices.plan(generation, 1, req.n)
        prompt = choices.Prompt(prompt_ids, generation.prompt)
        if req.stream:
            return await choices.stream_reply(request, reply, plan, [prompt])
        return await choices.json_reply(request, reply, plan, [prompt])
    return await pipeline.run(request, generation, reply, prompt_ids)


async def chat_generation(
    request: web.Request, req: ChatCompletionRequest
) -> tuple[Generation, list[int], ReplyParser]:
    """The conversation of ``req`` rendered with the chat template and tokenized, the
    request as the pipeline runs it (serve-side defaults, its constraint built and checked),
    and the parser of its reply (text, reasoning and tool calls in the template's syntax):
    what every surface that speaks in conversations needs."""
    config, template = request.app[CONFIG], request.app[CHAT_TEMPLATE]
    chat = req.conversation.render(template)
    # Tokenized here, in parts: the messages' text must never become control tokens.
    prompt_ids = await request.app[TOKENIZER].tokenize_chat(chat)
    parser = template.reply_parser(chat, req.calls_tools, config.reasoning_format)
    generation = dataclasses.replace(req.generation(config), prompt=chat.text)
    generation = with_defaults(generation, req, _defaults(request))
    generation = await constrained(request, generation, req.reply_constraint(parser))
    return generation, prompt_ids, parser


def _defaults(request: web.Request) -> SamplingDefaults:
    metadata = request.app[TOKENIZER].facts.sampling_metadata
    return sampling_defaults(request.app[CONFIG], metadata)


def _reply(
    request: web.Request, req: OpenAIRequest, surface: Surface, logprobs: int
) -> OpenAIReply:
    tokenizer = request.app[TOKENIZER]
    return OpenAIReply(surface, req.model, req.include_usage, tokenizer, logprobs)


def _served_model(request: web.Request) -> str:
    return _engine_ack(request).model_name


def _engine_ack(request: web.Request) -> HelloAck:
    # The engine's word, not our config: it is the one that loaded the model.
    ack = request.app[LINK].ack
    if ack is None:
        raise engine_unavailable()
    return ack


def check_model(request: web.Request, model: str) -> None:
    """A 404 for a model this server does not serve. Without the engine's word there is none
    to check against: the pipeline answers that 503, counted and logged as every request's."""
    ack = request.app[LINK].ack
    if ack is None:
        return
    served = ack.model_name
    if model != served:
        message = f"model {model!r} does not exist; this server serves {served!r}"
        raise ApiError(404, MODEL_NOT_FOUND, message, param="model")


async def _complete(
    request: web.Request, req: CompletionRequest, generation: Generation, reply: OpenAIReply
) -> web.StreamResponse:
    """One prompt, one choice, no echo: the single-request path (JSON or SSE); else the
    choices (``choices``), in one JSON reply or one stream."""
    if len(req.prompt) == 1 and req.n == 1 and not req.echo:
        [prompt] = req.prompt
        if isinstance(prompt, str):
            generation = dataclasses.replace(generation, prompt=prompt)
            return await pipeline.run(request, generation, reply)
        return await pipeline.run(request, generation, reply, prompt)
    prompts = [await _prompt(request, p) for p in req.prompt]
    plan = choices.plan(generation, len(prompts), req.n)
    if req.stream:  # echo does not stream (the request's rule)
        return await choices.stream_reply(request, reply, plan, prompts)
    return await choices.json_reply(request, reply, plan, prompts, req.echo)


async def _prompt(request: web.Request, prompt: str | list[int]) -> choices.Prompt:
    tokenizer = request.app[TOKENIZER]
    if isinstance(prompt, str):
        return choices.Prompt(await tokenizer.tokenize(prompt), prompt)
    check_token_ids(prompt, tokenizer.n_vocab)
    return choices.Prompt(prompt, await tokenizer.detokenize(prompt))
