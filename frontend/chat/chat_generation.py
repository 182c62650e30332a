"""A conversation as the pipeline runs it, for every surface that speaks in conversations
(chat completions, and the Responses and Messages requests translated into one): the model
id the reply names, the conversation rendered with the model's chat template, the serve-side
sampling defaults and the tenant, its constraint built and checked, and the parser of its
reply. ``openai_generation`` resolves the fields chat shares with completions."""

from __future__ import annotations

import hashlib
import re
from typing import Any

from aiohttp import web

from tinyserve.config import Config
from tinyserve.frontend.models.chat import ChatCompletionRequest, OpenAIRequest
from tinyserve.frontend.prompt import conversation
from tinyserve.frontend.prompt.chat_template import ChatPrompt
from tinyserve.frontend.request import admission
from tinyserve.frontend.request.generation import Generation, constrained, resolved
from tinyserve.frontend.request.sampling_defaults import SamplingDefaults, left_out
from tinyserve.frontend.request.state import CHAT_TEMPLATE, CONFIG, LINK, SAMPLING_DEFAULTS
from tinyserve.frontend.structured import constraints
from tinyserve.frontend.structured.reply_parser import ReplyParser
from tinyserve.protocol import TENANT_PATTERN


def served_model(request: web.Request, asked: str) -> str:
    """The id of the model that serves a request naming ``asked`` (``admission.model_of``)."""
    return admission.model_of(request.app[LINK].ack, request.app[CONFIG].model_alias, asked)


async def chat_generation(
    request: web.Request, req: ChatCompletionRequest
) -> tuple[Generation, ReplyParser]:
    """``req`` as the pipeline runs it: its conversation rendered with the chat template,
    serve-side defaults, its constraint built and checked; and the parser of its reply (text,
    reasoning and tool calls in the template's syntax). What every surface that speaks in
    conversations needs."""
    config, template = request.app[CONFIG], request.app[CHAT_TEMPLATE]
    prompt = conversation.render(template, req, req.messages)
    parser = template.reply_parser(prompt, req.calls_tools, config.reasoning_format)
    generation = chat_generation_of(req, config, request.app[SAMPLING_DEFAULTS], prompt)
    generation = await constrained(request, generation, constraints.of_chat(req, parser))
    return generation, parser


def chat_generation_of(
    req: ChatCompletionRequest,
    config: Config,
    defaults: SamplingDefaults | None = None,
    prompt: str | ChatPrompt = "",
) -> Generation:
    """A chat request with every default resolved, its rendered ``prompt`` given."""
    asked = req.max_completion_tokens or req.max_tokens
    logprobs = (req.top_logprobs or 0) if req.logprobs else -1
    return openai_generation(
        req, defaults, prompt=prompt, prompt_field="messages",
        max_tokens=asked or config.default_max_tokens, max_tokens_asked=asked is not None,
        logprobs=logprobs,
    )  # fmt: skip


def openai_generation(
    req: OpenAIRequest, defaults: SamplingDefaults | None, **overrides: Any
) -> Generation:
    """An OpenAI request resolved: the serve-side ``defaults`` for the sampling fields it
    left out (none: the model's), its ``user`` as the tenant unless it names one, then
    ``overrides``."""
    if "tenant" not in req.model_fields_set:
        overrides["tenant"] = _tenant_of_user(req.user)
    if defaults is not None:
        overrides |= left_out(req, defaults)
    return resolved(req, **overrides)


def _tenant_of_user(user: str) -> str:
    """``user`` as the scheduling tenant: as it is when it is a valid tenant name, else a
    stable hash of it (OpenAI suggests hashed e-mail addresses and the like)."""
    if not user:
        return "default"
    if re.fullmatch(TENANT_PATTERN, user):
        return user
    return "user-" + hashlib.sha256(user.encode("utf-8")).hexdigest()[:16]
