"""What a request asks to constrain its output with, as the grammar the engine enforces: a
client's own GBNF, a JSON schema, any JSON object, or the grammar of tool calls. A schema
that cannot be enforced is a 400 naming the field (the checks that need the served model
are the pipeline's: ``request.generation.constrained``)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from tinyserve.frontend.models.chat import ChatCompletionRequest
from tinyserve.frontend.models.errors import invalid
from tinyserve.frontend.models.native import GenerateRequest
from tinyserve.frontend.models.openai_requests import OpenAIRequest
from tinyserve.frontend.structured import tool_calls
from tinyserve.frontend.structured.json_schema import (
    ANY_JSON_OBJECT,
    SchemaError,
    schema_to_grammar,
)
from tinyserve.frontend.structured.reply_parser import ReplyParser

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


def of_generate(req: GenerateRequest) -> Constraint:
    """``/generate``'s: ``grammar`` or ``json_schema`` (or nothing)."""
    if req.json_schema is not None:
        return Constraint("json_schema", schema=req.json_schema)
    return Constraint("grammar", grammar=req.grammar)


def of_openai(req: OpenAIRequest) -> Constraint:
    """An OpenAI request's: ``grammar``, else the ``response_format``."""
    if req.grammar:
        return Constraint("grammar", grammar=req.grammar)
    response_format = req.response_format
    kind = "text" if response_format is None else response_format.type
    if response_format is not None and response_format.type == "json_schema":
        schema = response_format.json_schema.schema_
        return Constraint("response_format", schema={} if schema is None else schema)
    return Constraint("response_format", json_object=kind == "json_object")


def of_chat(req: ChatCompletionRequest, parser: ReplyParser) -> Constraint:
    """A chat request's: its ``grammar``, else the grammar of a reply that may call tools
    (in the syntax ``parser`` reads), else the ``response_format``'s; those built here begin
    as ``parser`` says (``ReplyParser.grammar_prefix``)."""
    if req.grammar or not req.calls_tools:
        constraint = of_openai(req)
    else:
        assert parser.tools is not None, "the parser of a reply that may call tools"
        choice = req.tool_choice or "auto"
        parallel = req.parallel_tool_calls
        grammar = tool_calls.tools_grammar(req.tools, choice, parallel, parser.tools)
        constraint = Constraint("tools", grammar=grammar, tools=True)
    return dataclasses.replace(constraint, prefix=parser.grammar_prefix)
