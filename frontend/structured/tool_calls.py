"""Tool calls: how tools and earlier calls reach the chat template, the grammar of a reply
that may call tools, and the parser of the calls in a reply, in the served template's syntax
(``structured.tool_syntax``).

A template with its own tool syntax is given the tools and the conversation as Hugging
Face's ``apply_chat_template(tools=...)`` gives them (``template_call``). Any other template
gets the generic format: the tools described in a system message (``tools_prompt``), a call
written

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

(the Hermes/Qwen convention, which small instruct models have seen) in its assistant message
and a tool's result as a user message ``<tool_response>...</tool_response>``.

When a call is required (``tool_choice`` required or a named function) the grammar admits
only calls, with arguments that follow each tool's parameter schema; with ``auto`` it admits
calls, or plain text that does not start like them, so a call the model starts is still a
valid one. A reply holds at most one call per tool offered (``parallel_tool_calls`` false,
or a template that renders one call per message: one call). No lazy grammar (see
``engine.runtime.sampler``).
"""

from __future__ import annotations

import json
from typing import Any

from tinyserve.frontend.models.errors import invalid
from tinyserve.frontend.models.tools import (
    FunctionCall,
    NamedToolChoice,
    Tool,
    ToolCall,
    ToolCallIn,
    ToolChoice,
)
from tinyserve.frontend.structured.json_schema import (
    PRIMITIVES,
    Grammar,
    SchemaError,
    schema_rules,
)
from tinyserve.frontend.structured.tool_syntax import GENERIC, ToolSyntax

_DECODER = json.JSONDecoder()
# Calls one reply may make, at least (more when more tools are offered), several of one tool
# among them.
MIN_CALLS = 2


def tools_prompt(tools: list[Tool], choice: ToolChoice) -> str:
    """The system text that offers ``tools`` to the model in the generic format."""
    specs = [
        {"name": t.function.name, "description": t.function.description or "",
         "parameters": t.function.parameters or {"type": "object"}}
        for t in tools
    ]  # fmt: skip
    must = ""
    if choice == "required":
        must = "You must call at least one tool.\n"
    elif isinstance(choice, NamedToolChoice):
        must = f"You must call the tool {choice.function.name}.\n"
    lines = "\n".join(json.dumps(spec, ensure_ascii=False) for spec in specs)
    call = '{"name": <tool name>, "arguments": <arguments as a JSON object>}'
    return (
        "You can call these tools (JSON descriptions, one a line):\n"
        f"{lines}\n{must}"
        "To call a tool, answer with only this, once per call:\n"
        f"{GENERIC.call_open}{call}{GENERIC.call_close}"
    )


def call_text(call: ToolCallIn) -> str:
    """An earlier tool call in the generic format, as the model would have written it."""
    body = {"name": call.function.name, "arguments": _arguments(call.function.arguments)}
    return f"{GENERIC.call_open}{json.dumps(body, ensure_ascii=False)}{GENERIC.call_close}"


def response_text(content: str) -> str:
    """A tool's result in the generic format, as the model reads it."""
    return f"<tool_response>\n{content}\n</tool_response>"


def template_call(call: ToolCallIn) -> dict[str, Any]:
    """An earlier tool call as a template with its own syntax takes it: OpenAI's shape, with
    the arguments as an object (templates write them with ``tojson``)."""
    function = {"name": call.function.name, "arguments": _arguments(call.function.arguments)}
    return {"id": call.id, "type": "function", "function": function}


def _arguments(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def tools_grammar(
    tools: list[Tool],
    choice: ToolChoice,
    parallel: bool,
    syntax: ToolSyntax = GENERIC,
    answer: Grammar | None = None,
) -> tuple[str, list[str]]:
    """The grammar of the reply: calls only (``required``, a named function) or calls or an
    answer (``auto``): plain text, or what ``answer`` accepts (a ``response_format``'s). Also
    what of the parameter schemas it does not enforce (``function NAME: /path: keyword``)."""
    named = choice.function.name if isinstance(choice, NamedToolChoice) else None
    offered = [t for t in tools if named is None or t.function.name == named]
    rules: list[str] = []
    alternatives = []
    unenforced: list[str] = []
    for i, tool in enumerate(offered):
        name = tool.function.name
        try:
            args = schema_rules(tool.function.parameters or {"type": "object"}, f"t{i}r")
        except SchemaError as exc:
            raise invalid(f"'tools' function {name!r} parameters: {exc}", "tools") from None
        rules += args.rules
        unenforced += [f"function {name}: {where}" for where in args.unenforced]
        head = f'{{"name": {json.dumps(name)}, "{syntax.arguments_key}": '
        alternatives.append(_sequence(_literal(head), f"({args.root})", _literal("}")))
    choices = f"({' | '.join(alternatives)})"
    call = _sequence(_literal(syntax.call_open), choices, _literal(syntax.call_close))
    # NOTE: a bounded number of calls: a small model, free to go on, calls tools again and
    # again until max_tokens cuts the reply (seen with the default model).
    more = max(len(offered), MIN_CALLS) - 1 if parallel and not syntax.single_call else 0
    another = _sequence(_literal(syntax.separator), "call")
    more_calls = f"({another}){{0,{more}}}" if more else ""
    opening = (syntax.marker if syntax.writes_marker else "") + syntax.list_open
    calls = _sequence(_literal(opening), "call", more_calls, _literal(syntax.list_close))
    if choice == "auto" and answer is not None:
        calls = f"{calls} | {answer.root}"
        rules += answer.rules
    elif choice == "auto":
        firsts = "".join(sorted({f"\\x{ord(s[0]):02X}" for s in syntax.starts}))
        calls = f"{calls} | [^{firsts}] [^\\x00]*"
    grammar = "\n".join([f"root ::= {calls}", f"call ::= {call}", *rules]) + "\n" + PRIMITIVES
    return grammar, unenforced


def _sequence(*pieces: str) -> str:
    """GBNF pieces in a row, empty ones left out."""
    return " ".join(piece for piece in pieces if piece)


def _literal(text: str) -> str:
    """``text`` as a GBNF string literal (JSON's escapes are GBNF's), or nothing."""
    return json.dumps(text) if text else ""


def parse_calls(text: str, syntax: ToolSyntax = GENERIC, cut: bool = False) -> list[ToolCall]:
    """The tool calls ``text`` (a reply from where its calls begin) holds, or none when it is
    not (only) calls: plain text, or a lone call cut short. With ``cut`` (``max_tokens``
    ended the reply) a call left unfinished after complete ones is dropped and the complete
    ones kept."""
    found, ended, tail = _scan(text, syntax)
    if not found or not (ended or (cut and _cut_short(tail, syntax))):
        return []
    calls = []
    keys = (syntax.arguments_key, "arguments", "parameters")  # either, whatever the family
    for call in found:
        name = call.get("name")
        if not isinstance(name, str):
            return []
        arguments: Any = next((call[key] for key in keys if key in call), {})
        function = FunctionCall(name=name, arguments=json.dumps(arguments, ensure_ascii=False))
        calls.append(ToolCall(id=syntax.mint_id(), function=function))
    return calls


class _Scanner:
    """Reads ``text`` from ``pos`` on, skipping whitespace before each piece."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def take(self, token: str) -> bool:
        """Whether ``token`` comes next (past whitespace); taken if so."""
        while self.pos < len(self.text) and self.text[self.pos].isspace():
            self.pos += 1
        if self.text.startswith(token, self.pos):
            self.pos += len(token)
            return True
        return False

    def json_object(self) -> dict[str, Any] | None:
        """The JSON object that comes next (taken), or None."""
        self.take("")
        try:
            value, end = _DECODER.raw_decode(self.text, self.pos)
        except (ValueError, RecursionError):  # RecursionError: nested past Python's limit
            return None
        if not isinstance(value, dict):
            return None
        self.pos = end
        return value


def _scan(text: str, syntax: ToolSyntax) -> tuple[list[dict[str, Any]], bool, str]:
    """The complete calls from the start of ``text``, whether the text ended properly after
    them, and what was left unread after the last one."""
    scan = _Scanner(text)
    if syntax.marker:
        scan.take(syntax.marker)  # optional: see ToolSyntax
    found: list[dict[str, Any]] = []
    if not scan.take(syntax.list_open):
        return found, False, text
    while True:
        before = scan.pos
        call = None
        if (not found or scan.take(syntax.separator.strip())) and scan.take(
            syntax.call_open.strip()
        ):
            call = scan.json_object()
        if call is None or not scan.take(syntax.call_close.strip()):
            scan.pos = before
            break
        found.append(call)
    tail = text[scan.pos :]
    ended = scan.take(syntax.list_close) and not text[scan.pos :].strip()
    return found, ended, tail


def _cut_short(tail: str, syntax: ToolSyntax) -> bool:
    """``tail``, after complete calls, is the start of one more (or of the list's end)."""
    rest = tail.strip()
    nexts = [t.strip() for t in (syntax.separator, syntax.call_open, syntax.list_close)]
    return not rest or any(t and (rest.startswith(t) or t.startswith(rest)) for t in nexts)
