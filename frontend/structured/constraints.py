"""What a request asks to constrain its output with, as the grammar the engine enforces, and
the checks that need the served model: the grammar builds with its vocabulary, the
``logit_bias`` token ids are in it. Each failure is a 400 naming the field; both outcomes
are counted (``tinyserve_constrained_requests_total``)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from aiohttp import web

from tinyserve.frontend.http.api_errors import ApiError, invalid
from tinyserve.frontend.http.appkeys import LINK, METRICS, TOKENIZER
from tinyserve.frontend.request.generation import Generation, check_token_ids
from tinyserve.frontend.request.reply_common import engine_unavailable
from tinyserve.frontend.structured.json_schema import (
    ANY_JSON_OBJECT,
    SchemaError,
    schema_to_grammar,
)

# Metric sources.
GRAMMAR, JSON_SCHEMA, JSON_OBJECT, TOOLS = "grammar", "json_schema", "json_object", "tools"


@dataclasses.dataclass(frozen=True)
class Constraint:
    """One request's constraint: GBNF, a JSON schema, or any JSON object; ``field`` is the
    request field it came from (named in a 400). ``prefix`` is text the output begins with
    before what the constraint describes, in the grammars built here (a client's own grammar
    says all there is)."""

    field: str
    grammar: str = ""
    schema: dict[str, Any] | None = None
    json_object: bool = False
    tools: bool = False  # the grammar of tool calls (``structured.tool_calls``)
    prefix: str = ""

    @property
    def source(self) -> str | None:
        if self.tools:
            return TOOLS
        if self.schema is not None:
            return JSON_SCHEMA
        return JSON_OBJECT if self.json_object else GRAMMAR if self.grammar else None

    def build(self) -> str:
        """The GBNF text; a 400 when the schema asks for what cannot be enforced."""
        if self.source in (GRAMMAR, None):
            return self.grammar
        built = ANY_JSON_OBJECT if self.json_object else self.grammar
        if self.schema is not None:
            try:
                built = schema_to_grammar(self.schema)
            except SchemaError as exc:
                raise invalid(f"'{self.field}' is not supported: {exc}", self.field) from None
        if not self.prefix:
            return built
        # Every grammar built here states its root on its first line.
        root, rest = built.split("\n", 1)
        assert root.startswith("root ::= "), root
        return f"root ::= {json.dumps(self.prefix)} ({root.removeprefix('root ::= ')})\n{rest}"


def response_format_constraint(response_format: Any) -> Constraint:
    """OpenAI's ``response_format`` (already validated)."""
    kind = "text" if response_format is None else response_format.type
    if kind == "json_schema":
        schema = response_format.json_schema.schema_
        return Constraint("response_format", schema={} if schema is None else schema)
    return Constraint("response_format", json_object=kind == "json_object")


async def constrained(
    request: web.Request, generation: Generation, constraint: Constraint
) -> Generation:
    """``generation`` with the constraint's grammar, every check passed (else a 400)."""
    source = constraint.source
    try:
        if source is not None:
            sampling = dataclasses.replace(generation.sampling, grammar=constraint.build())
            generation = dataclasses.replace(generation, sampling=sampling)
        await _check(request, generation, constraint.field)
    except ApiError:
        if source is not None:
            _count(request, source, "invalid")
        raise
    if source is not None:
        _count(request, source, "ok")
    return generation


def _count(request: web.Request, source: str, result: str) -> None:
    metric = request.app[METRICS].counter("tinyserve_constrained_requests_total")
    metric.labels(source, result).inc()


async def _check(request: web.Request, generation: Generation, field: str) -> None:
    sampling = generation.sampling
    if sampling.logit_bias:
        ack = request.app[LINK].ack
        if ack is None:
            raise engine_unavailable()
        check_token_ids(sampling.logit_bias, ack.n_vocab, "logit_bias")
    if not sampling.grammar:
        return
    if sampling.ignore_eos or sampling.min_tokens:
        which = "ignore_eos" if sampling.ignore_eos else "min_tokens"
        message = f"'{which}' cannot be combined with '{field}': the output must end where it does"
        raise invalid(message, which)
    problem = await request.app[TOKENIZER].grammar_problem(sampling.grammar)
    if problem is not None:
        raise invalid(f"'{field}' does not compile: {problem}", field)
