"""Anthropic's Messages API: ``POST /v1/messages`` and ``POST /v1/messages/count_tokens``.

A request is translated into the equivalent conversation (``anthropic_requests``) and served
by the same path as ``/v1/chat/completions``: the chat template, tool prompts and grammars,
structured output, sampling defaults, admission, tenants and priorities, the pipeline; only
the reply is Anthropic's (``anthropic_reply``), with the model's thinking in thinking blocks.
Errors take Anthropic's shape (the error middleware decides by path). Any model id is served,
as on the OpenAI surface, unless ``--model-alias`` closes the list (``admission.model_of``).
"""

from __future__ import annotations

from aiohttp import web

from tinyserve.frontend.anthropic.anthropic_replies import TokenCount
from tinyserve.frontend.anthropic.anthropic_reply import AnthropicReply
from tinyserve.frontend.anthropic.anthropic_requests import CountTokensRequest, MessagesRequest
from tinyserve.frontend.chat.chat_generation import chat_generation, served_model
from tinyserve.frontend.models.common import json_response
from tinyserve.frontend.models.parse import read_body
from tinyserve.frontend.prompt import conversation
from tinyserve.frontend.request import pipeline
from tinyserve.frontend.request.state import CHAT_TEMPLATE, CONFIG, TOKENIZER


async def messages(request: web.Request) -> web.StreamResponse:
    """Answer a conversation in Anthropic's shapes; JSON or SSE."""
    req = await read_body(request, MessagesRequest, request.app[CONFIG])
    model = served_model(request, req.model)
    generation, parser = await chat_generation(request, req.turn())
    reply = AnthropicReply(model, parser)
    return await pipeline.run(request, generation, reply)


async def count_tokens(request: web.Request) -> web.Response:
    """The prompt tokens a Messages request with this conversation is charged: the same
    rendering and tokenization, without generating."""
    req = await read_body(request, CountTokensRequest, request.app[CONFIG])
    served_model(request, req.model)
    prompt = conversation.render(request.app[CHAT_TEMPLATE], req.conversation())
    prompt_ids = await request.app[TOKENIZER].tokenize_chat(prompt)
    return json_response(TokenCount(input_tokens=len(prompt_ids)))
