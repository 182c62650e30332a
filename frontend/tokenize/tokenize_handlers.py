"""The tokenizer routes, in vLLM's shapes: ``POST /tokenize``, ``POST /detokenize``,
``GET /tokenizer_info``. An evaluation harness (lm-evaluation-harness's
``tokenizer_backend=remote``) tokenizes with the server's own vocabulary through them, so it
needs no tokenizer download and counts exactly the tokens the engine will see."""

from __future__ import annotations

from typing import TypeVar

from aiohttp import web

from tinyserve.frontend.models.common import json_response
from tinyserve.frontend.models.parse import read_body
from tinyserve.frontend.prompt import conversation
from tinyserve.frontend.request import admission
from tinyserve.frontend.request.generation import check_token_ids
from tinyserve.frontend.request.state import CHAT_TEMPLATE, CONFIG, LINK, TOKENIZER
from tinyserve.frontend.tokenize.tokenize_bodies import (
    DetokenizeReply,
    DetokenizeRequest,
    TokenizeReply,
    TokenizeRequest,
    TokenizerInfo,
)
from tinyserve.model import model_name
from tinyserve.options import DEFAULT_CTX_FLOOR

TOKENIZER_CLASS = "llama.cpp"  # the GGUF's own vocabulary, through llama.cpp


async def tokenize(request: web.Request) -> web.Response:
    """Token ids of a text or of a conversation rendered with the chat template."""
    app = request.app
    req = await _parsed(request, TokenizeRequest)
    tokenizer = app[TOKENIZER]
    if req.messages is not None:
        prompt = conversation.render(app[CHAT_TEMPLATE], req.conversation(req.messages))
        ids = await tokenizer.tokenize_chat(prompt)
    else:
        assert req.prompt is not None
        add_special = req.add_special_tokens is not False
        ids = await tokenizer.tokenize_text(req.prompt, add_special)
    strs = None
    if req.return_token_strs:
        strs = [p.decode("utf-8", "replace") for p in await tokenizer.token_pieces(ids)]
    reply = TokenizeReply(count=len(ids), max_model_len=_max_len(request), tokens=ids)
    reply.token_strs = strs
    return json_response(reply)


async def detokenize(request: web.Request) -> web.Response:
    """The text of token ids (special tokens spelled out)."""
    req = await _parsed(request, DetokenizeRequest)
    tokenizer = request.app[TOKENIZER]
    check_token_ids(req.tokens, tokenizer.n_vocab, "tokens")
    return json_response(DetokenizeReply(prompt=await tokenizer.detokenize(req.tokens)))


async def tokenizer_info(request: web.Request) -> web.Response:
    """The vocabulary's facts: special tokens, BOS rule, chat template, sizes."""
    tokenizer = request.app[TOKENIZER]
    facts = tokenizer.facts
    info = TokenizerInfo(
        tokenizer_class=TOKENIZER_CLASS,
        model=_model(request),
        vocab_size=tokenizer.n_vocab,
        model_max_length=_max_len(request),
        bos_token=facts.bos_text,
        eos_token=facts.eos_text,
        add_bos_token=facts.adds_bos,
        chat_template=facts.chat_template,
    )
    return json_response(info)


B = TypeVar("B", TokenizeRequest, DetokenizeRequest)


async def _parsed(request: web.Request, model: type[B]) -> B:
    """The body as ``model``; a ``model`` field, when given, must name an id the served model
    answers to (``admission.model_of``: the tokenizer is that model's)."""
    req = await read_body(request, model, request.app[CONFIG])
    if req.model is not None:
        admission.model_of(request.app[LINK].ack, request.app[CONFIG].model_alias, req.model)
    return req


def _model(request: web.Request) -> str:
    # The engine's word once it said so (it loaded the model), else our config's.
    ack, config = request.app[LINK].ack, request.app[CONFIG]
    return ack.model_name if ack is not None else model_name(config.model, config.model_name)


def _max_len(request: web.Request) -> int:
    # The engine's context once it said so; the configured one (or its default) before.
    ack = request.app[LINK].ack
    if ack is not None:
        return ack.n_ctx
    return request.app[CONFIG].ctx_per_slot or DEFAULT_CTX_FLOOR
