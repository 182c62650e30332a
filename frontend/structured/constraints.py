"""What a request asks to constrain its output with, as the grammar the engine enforces: a
client's own GBNF, a JSON schema, any JSON object, or the grammar of tool calls (with an
answer in a ``response_format`` beside them). A schema constrains what the grammar can
enforce; what it cannot is listed for the request's report, and only a schema that is no
schema is a 400 naming the field (the checks that need the served model are the pipeline's:
``request.generation.constrained``)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from tinyserve.frontend.models.chat import OpenAIRequest
from tinyserve.frontend.models.conversation import Turn
from tinyserve.frontend.models.errors import invalid
from tinyserve.frontend.models.response_format import ResponseFormat
from tinyserve.frontend.structured import tool_calls
from tinyserve.frontend.structured.json_schema import (
    ANY_JSON_OBJECT,
    Grammar,
    SchemaError,
    schema_rules,
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
    unenforced: tuple[str, ...] = ()  # what of the tools' schemas the grammar leaves out

    @property
    def source(self) -> str | None:
        if self.tools:
            return TOOLS
        if self.schema is not None:
            return JSON_SCHEMA
        return JSON_OBJECT if self.json_object else GRAMMAR if self.grammar else None

    def build(self) -> tuple[str, list[str]]:
        """The GBNF text, and what of the schema it does not enforce (``path: keyword``); a
        400 when the schema is no schema."""
        if self.source in (GRAMMAR, None):
            return self.grammar, []
        built = ANY_JSON_OBJECT if self.json_object else self.grammar
        unenforced: list[str] = []
        if self.schema is not None:
            try:
                built, unenforced = schema_to_grammar(self.schema)
            except SchemaError as exc:
                raise invalid(f"'{self.field}' is not a schema: {exc}", self.field) from None
        unenforced = [*self.unenforced, *unenforced]
        if not self.prefix:
            return built, unenforced
        # Every grammar built here states its root on its first line.
        root, rest = built.split("\n", 1)
        assert root.startswith("root ::= "), root
        body = root.removeprefix("root ::= ")
        return f"root ::= {json.dumps(self.prefix)} ({body})\n{rest}", unenforced


def of_openai(req: OpenAIRequest) -> Constraint:
    """An OpenAI request's: ``grammar``, else the ``response_format``."""
    return _of_format(req.grammar, req.response_format)


def _of_format(grammar: str, response_format: ResponseFormat | None) -> Constraint:
    """``grammar``, else ``response_format``."""
    if grammar:
        return Constraint("grammar", grammar=grammar)
    kind = "text" if response_format is None else response_format.type
    if response_format is not None and response_format.type == "json_schema":
        schema = response_format.json_schema.schema_
        return Constraint("response_format", schema={} if schema is None else schema)
    return Constraint("response_format", json_object=kind == "json_object")


def of_chat(turn: Turn, parser: ReplyParser) -> Constraint:
    """A turn's: its ``grammar``, else the grammar of a reply that may call tools (in the
    syntax ``parser`` reads; under tool choice auto, the answer beside the calls in the
    ``response_format`` when it has one), else the ``response_format``'s; those built here
    begin as ``parser`` says (``ReplyParser.grammar_prefix``)."""
    conversation = turn.conversation
    asked = _of_format(turn.sampling.grammar, turn.response_format)
    if turn.sampling.grammar or not conversation.calls_tools:
        constraint = asked
    else:
        assert parser.tools is not None, "the parser of a reply that may call tools"
        choice, parallel = conversation.tool_choice or "auto", turn.parallel_tool_calls
        answer = _answer(asked)
        grammar, unenforced = tool_calls.tools_grammar(
            conversation.tools, choice, parallel, parser.tools, answer
        )
        unenforced += answer.unenforced if answer is not None else []
        constraint = Constraint("tools", grammar=grammar, tools=True, unenforced=tuple(unenforced))
    return dataclasses.replace(constraint, prefix=parser.grammar_prefix)


def _answer(format_: Constraint) -> Grammar | None:
    """The grammar of a ``response_format`` answer beside tool calls (None: plain text)."""
    if format_.json_object:
        return Grammar("object", [], [])
    if format_.schema is None:
        return None
    try:
        return schema_rules(format_.schema, "a")
    except SchemaError as exc:
        raise invalid(f"'{format_.field}' is not a schema: {exc}", format_.field) from None
