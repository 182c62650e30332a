"""A turn in a conversation as the pipeline runs it, for every surface that speaks in
conversations (chat completions, and the Responses and Messages requests translated into
one: ``models.conversation``): the model id the reply names, the conversation rendered with
the model's chat template, the serve-side sampling defaults and the tenant, its constraint
built and checked, and the parser of its reply. ``openai_generation`` resolves the fields
chat shares with completions."""

from __future__ import annotations

import hashlib
import re
from typing import Any

from aiohttp import web

from tinyserve.config import Config
from tinyserve.frontend.models.conversation import Turn
from tinyserve.frontend.models.fields import Sampling
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


async def chat_generation(request: web.Request, turn: Turn) -> tuple[Generation, ReplyParser]:
    """``turn`` as the pipeline runs it: its conversation rendered with the chat template,
    serve-side defaults, its constraint built and checked; and the parser of its reply (text,
    reasoning and tool calls in the template's syntax). What every surface that speaks in
    conversations needs."""
    config, template = request.app[CONFIG], request.app[CHAT_TEMPLATE]
    prompt = conversation.render(template, turn.conversation)
    parser = template.reply_parser(prompt, turn.conversation.calls_tools, config.reasoning_format)
    generation = chat_generation_of(turn, config, request.app[SAMPLING_DEFAULTS], prompt)
    generation = await constrained(request, generation, constraints.of_chat(turn, parser))
    return generation, parser


def chat_generation_of(
    turn: Turn,
    config: Config,
    defaults: SamplingDefaults | None = None,
    prompt: str | ChatPrompt = "",
) -> Generation:
    """A turn with every default resolved, its rendered ``prompt`` given."""
    asked = turn.max_tokens
    return openai_generation(
        turn.sampling, turn.user, defaults, prompt=prompt, prompt_field="messages",
        max_tokens=asked or config.default_max_tokens, max_tokens_asked=asked is not None,
        logprobs=turn.logprobs,
    )  # fmt: skip


def openai_generation(
    req: Sampling, user: str, defaults: SamplingDefaults | None, **overrides: Any
) -> Generation:
    """A request's sampling fields resolved: the serve-side ``defaults`` for those it left
    out (none: the model's), its end ``user`` as the tenant unless it names one, then
    ``overrides``."""
    if "tenant" not in req.model_fields_set:
        overrides["tenant"] = _tenant_of_user(user)
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
