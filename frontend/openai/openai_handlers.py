"""OpenAI-compatible routes: ``GET /v1/models`` (and ``/v1/models/{model}``),
``POST /v1/completions``, ``POST /v1/chat/completions``.

Each parses its body into its model (``openai_requests``, ``models.chat``), checks the
model id against the one the engine serves, translates it into a ``Generation`` (the
serve-side sampling defaults for the fields it left out; for chat, the conversation rendered
with the model's chat template, and how its reply is read: ``chat.chat_generation``), and
runs the same pipeline as ``/generate`` with an OpenAI-format reply. Errors under ``/v1/``
take OpenAI's shape (the error middleware decides by path).
"""

from __future__ import annotations

from aiohttp import web

from tinyserve.config import Config
from tinyserve.frontend.chat.chat_generation import chat_generation, openai_generation, served_model
from tinyserve.frontend.models.chat import ChatCompletionRequest, OpenAIRequest
from tinyserve.frontend.models.common import json_response
from tinyserve.frontend.models.parse import read_body
from tinyserve.frontend.openai import choices
from tinyserve.frontend.openai.openai_replies import Model, ModelList
from tinyserve.frontend.openai.openai_reply import OpenAIReply
from tinyserve.frontend.openai.openai_requests import CompletionRequest
from tinyserve.frontend.openai.openai_stream import CHAT, COMPLETIONS, Surface
from tinyserve.frontend.prompt.chat_template import ChatPrompt
from tinyserve.frontend.request import pipeline
from tinyserve.frontend.request.admission import serving
from tinyserve.frontend.request.generation import Generation, check_token_ids, constrained
from tinyserve.frontend.request.sampling_defaults import SamplingDefaults
from tinyserve.frontend.request.state import CONFIG, LINK, SAMPLING_DEFAULTS, TOKENIZER
from tinyserve.frontend.structured import constraints
from tinyserve.frontend.structured.reply_parser import ReplyParser

OWNED_BY = "tinyserve"


async def list_models(request: web.Request) -> web.Response:
    """The one served model; its id is ``--model-name`` or the model file's name, then each
    ``--model-alias``."""
    served = _model_entry(request)
    aliases = [served.model_copy(update={"id": a}) for a in request.app[CONFIG].model_alias]
    return json_response(ModelList(data=[served, *aliases]))


async def retrieve_model(request: web.Request) -> web.Response:
    """The served model by an id it answers to (the openai client's ``models.retrieve``)."""
    served_model(request, request.match_info["model"])
    return json_response(_model_entry(request))


def _model_entry(request: web.Request) -> Model:
    created = int(request.app[TOKENIZER].facts.model_path.stat().st_mtime)
    defaults = request.app[SAMPLING_DEFAULTS]
    # The engine's word, not our config: it is the one that loaded the model.
    ack = serving(request.app[LINK])
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
    req = await read_body(request, CompletionRequest, config)
    model = served_model(request, req.model)
    generation = completion_generation(req, config, request.app[SAMPLING_DEFAULTS])
    generation = await constrained(request, generation, constraints.of_openai(req))
    reply = _reply(request, req, model, COMPLETIONS, generation.sampling.logprobs)
    if len(req.prompt) == 1 and req.n == 1 and not req.echo:  # one request, JSON or SSE
        [prompt] = req.prompt
        if isinstance(prompt, list):
            return await pipeline.run(request, generation, reply, prompt)
        return await pipeline.run(request, generation, reply)
    prompts = [await _prompt(request, p) for p in req.prompt]
    plan = choices.plan(generation, len(prompts), req.n)
    if req.stream:  # echo does not stream (the request's rule)
        return await choices.stream_reply(request, reply, plan, prompts)
    return await choices.json_reply(request, reply, plan, prompts, req.echo)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    """Answer a conversation, rendered with the model's own chat template; JSON or SSE."""
    config = request.app[CONFIG]
    req = await read_body(request, ChatCompletionRequest, config)
    model = served_model(request, req.model)
    generation, parser = await chat_generation(request, req.turn())
    reply = _reply(request, req, model, CHAT, generation.sampling.logprobs, parser)
    if req.n == 1:
        return await pipeline.run(request, generation, reply)
    assert isinstance(generation.prompt, ChatPrompt)
    prompt = choices.Prompt(await pipeline.tokenized(request, generation), generation.prompt.text)
    plan = choices.plan(generation, 1, req.n)
    if req.stream:
        return await choices.stream_reply(request, reply, plan, [prompt])
    return await choices.json_reply(request, reply, plan, [prompt])


def completion_generation(
    req: CompletionRequest, config: Config, defaults: SamplingDefaults | None = None
) -> Generation:
    """A completion request with every default resolved; the prompt is the text of a call
    with one text prompt, else empty (each of ``prompt`` is tokenized on its own)."""
    logprobs = -1 if req.logprobs is None else req.logprobs
    max_tokens = config.default_max_tokens if req.max_tokens is None else req.max_tokens
    [one] = req.prompt if len(req.prompt) == 1 else [None]
    return openai_generation(
        req, req.user, defaults, prompt=one if isinstance(one, str) else "", max_tokens=max_tokens,
        max_tokens_asked=req.max_tokens is not None, logprobs=logprobs,
        prompt_logprobs=logprobs if req.echo else -1,
    )  # fmt: skip


def _reply(
    request: web.Request,
    req: OpenAIRequest,
    model: str,
    surface: Surface,
    logprobs: int,
    parser: ReplyParser | None = None,
) -> OpenAIReply:
    tokenizer = request.app[TOKENIZER]
    return OpenAIReply(surface, model, req.include_usage, tokenizer, logprobs, parser)


async def _prompt(request: web.Request, prompt: str | list[int]) -> choices.Prompt:
    tokenizer = request.app[TOKENIZER]
    if isinstance(prompt, str):
        return choices.Prompt(await tokenizer.tokenize(prompt), prompt)
    check_token_ids(prompt, tokenizer.n_vocab)
    return choices.Prompt(prompt, await tokenizer.detokenize(prompt))
