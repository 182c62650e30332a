"""What a request asks to constrain its output with, as the grammar the engine enforces, and
the checks that need the served model: the grammar builds with its vocabulary, the
``logit_bias`` token ids are in it. Each failure is a 400 naming the field."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from tinyserve.frontend.http.api_errors import invalid
from tinyserve.frontend.http.appkeys import LINK, TOKENIZER
from tinyserve.frontend.request.generation import Generation
from tinyserve.frontend.request.reply_common import engine_unavailable
from tinyserve.frontend.structured.json_schema import (
    ANY_JSON_OBJECT,
    SchemaError,
    schema_to_grammar,
)


def schema_grammar(schema: Any, field: str) -> str:
    """The grammar of ``schema``; a 400 naming ``field`` and the place in the schema when it
    asks for something the converter cannot enforce."""
    try:
        return schema_to_grammar(schema)
    except SchemaError as exc:
        raise invalid(f"'{field}' is not supported: {exc}", field) from None


def response_format_grammar(response_format: Any) -> str:
    """OpenAI's ``response_format`` (already validated) as a grammar; "" for plain text."""
    if response_format is None or response_format.type == "text":
        return ""
    if response_format.type == "json_object":
        return ANY_JSON_OBJECT
    return schema_grammar(response_format.json_schema.schema_, "response_format")


async def check_constraints(request: web.Request, generation: Generation, field: str) -> None:
    """The grammar (named ``field`` in a 400) builds with the served vocabulary and every
    ``logit_bias`` token is in it."""
    sampling = generation.sampling
    if sampling.logit_bias:
        ack = request.app[LINK].ack
        if ack is None:
            raise engine_unavailable()
        bad = next((t for t in sampling.logit_bias if t >= ack.n_vocab), None)
        if bad is not None:
            message = f"'logit_bias' token id {bad} is not in the vocabulary (size {ack.n_vocab})"
            raise invalid(message, "logit_bias")
    if not sampling.grammar:
        return
    if sampling.ignore_eos or sampling.min_tokens:
        which = "ignore_eos" if sampling.ignore_eos else "min_tokens"
        message = f"'{which}' cannot be combined with '{field}': the output must end where it does"
        raise invalid(message, which)
    problem = await request.app[TOKENIZER].grammar_problem(sampling.grammar)
    if problem is not None:
        raise invalid(f"'{field}' does not compile: {problem}", field)
