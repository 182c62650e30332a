"""Tool calling in a generic format, for models whose chat template has no tool syntax (the
default model's has none): the tools are described in a system message, a call is

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

(the Hermes/Qwen convention, which small instruct models have seen), an earlier call is
rendered that way in its assistant message and a tool's result goes back as a user message
``<tool_response>...</tool_response>``. When a call is required (``tool_choice`` required or
a named function) the grammar admits only calls, with arguments that follow each tool's
parameter schema; with ``auto`` it admits a call or plain text that does not start with
``<``, so a call the model starts is still a valid one. A reply holds at most one call per
tool offered (``parallel_tool_calls`` false: one call). No lazy grammar (see
``engine.sampler``).
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

from tinyserve.frontend.http.api_errors import invalid
from tinyserve.frontend.models.openai_reply_bodies import (
    AssistantMessage,
    FinishReason,
    FunctionCall,
    ToolCall,
)
from tinyserve.frontend.models.tools import NamedToolChoice, Tool, ToolCallIn, ToolChoice
from tinyserve.frontend.structured.json_schema import PRIMITIVES, SchemaError, schema_rules

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


def tools_prompt(tools: list[Tool], choice: ToolChoice) -> str:
    """The system text that offers ``tools`` to the model."""
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
    return (
        "You can call these tools (JSON descriptions, one a line):\n"
        f"{lines}\n{must}"
        "To call a tool, answer with only this, once per call:\n"
        f'{OPEN}\n{{"name": <tool name>, "arguments": <arguments as a JSON object>}}\n{CLOSE}'
    )


def call_text(call: ToolCallIn) -> str:
    """An earlier tool call, as the model would have written it."""
    try:
        arguments = json.loads(call.function.arguments)
    except ValueError:
        arguments = call.function.arguments
    body = json.dumps({"name": call.function.name, "arguments": arguments}, ensure_ascii=False)
    return f"{OPEN}\n{body}\n{CLOSE}"


def response_text(content: str) -> str:
    """A tool's result, as the model reads it."""
    return f"<tool_response>\n{content}\n</tool_response>"


def tools_grammar(tools: list[Tool], choice: ToolChoice, parallel: bool) -> str:
    """The grammar of the reply: calls only (``required``, a named function) or a call or
    plain text (``auto``). A 400 naming ``tools`` when a parameter schema cannot be enforced."""
    named = choice.function.name if isinstance(choice, NamedToolChoice) else None
    offered = [t for t in tools if named is None or t.function.name == named]
    rules: list[str] = []
    alternatives = []
    for i, tool in enumerate(offered):
        try:
            args, used = schema_rules(tool.function.parameters or {"type": "object"}, f"t{i}r")
        except SchemaError as exc:
            message = f"'tools' function {tool.function.name!r} parameters: {exc}"
            raise invalid(message, "tools") from None
        rules += used
        name = json.dumps(json.dumps(tool.function.name))
        alternatives.append(f'"{{\\"name\\": " {name} ", \\"arguments\\": " {args} "}}"')
    call = f'"{OPEN}\\n" ({" | ".join(alternatives)}) "\\n{CLOSE}"'
    # NOTE: at most one call per tool offered: a small model, free to go on, calls the same
    # tool again and again until max_tokens cuts the reply (seen with the default model).
    more = len(offered) - 1 if parallel else 0
    calls = f'call ("\\n" call){{0,{more}}}' if more else "call"
    root = calls if choice != "auto" else f"{calls} | [^<] [^\\x00]*"
    return "\n".join([f"root ::= {root}", f"call ::= {call}", *rules]) + "\n" + PRIMITIVES


def parse_calls(text: str, cut: bool = False) -> list[ToolCall]:
    """The tool calls ``text`` holds, or none when it is not (only) calls: plain text, or a
    lone call cut short. With ``cut`` (``max_tokens`` ended the reply) a call left unfinished
    after complete ones is dropped and the complete ones kept."""
    if not text.lstrip().startswith(OPEN):
        return []
    bodies = _CALL.findall(text)
    rest = _CALL.sub("", text).strip()
    if rest and not (cut and _unfinished_call(rest) and text.rstrip().endswith(rest)):
        return []
    calls = []
    for body in bodies:
        try:
            call: Any = json.loads(body)
            name, arguments = call["name"], call.get("arguments", {})
        except (ValueError, KeyError, TypeError):
            return []
        if not isinstance(name, str):
            return []
        function = FunctionCall(name=name, arguments=json.dumps(arguments, ensure_ascii=False))
        calls.append(ToolCall(id=f"call_{uuid.uuid4().hex[:24]}", function=function))
    return calls


def _unfinished_call(text: str) -> bool:
    """``text`` is the start of one call that never reached its end."""
    return (text.startswith(OPEN) or OPEN.startswith(text)) and text.count(OPEN) <= 1


def reply_message(text: str, reason: FinishReason) -> tuple[AssistantMessage, FinishReason]:
    """The assistant message for ``text`` and its finish reason: tool calls when it holds
    them (``tool_calls``, or ``length`` when ``max_tokens`` cut a further call short), else
    the text as it is."""
    cut = reason == "length"
    calls = parse_calls(text, cut)
    if not calls:
        return AssistantMessage(content=text), reason
    return AssistantMessage(content=None, tool_calls=calls), "length" if cut else "tool_calls"


class HeldText:
    """A streamed reply's text held back while it may be a tool call: a reply that turns out
    to be plain text is let through as soon as it cannot be a call any more; a call comes
    out whole at the end (one delta with its complete arguments)."""

    def __init__(self) -> None:
        self.text = ""
        self.deciding = True

    def feed(self, text: str) -> str:
        """What of ``text`` may be sent now."""
        if not self.deciding:
            return text
        self.text += text
        start = self.text.lstrip()
        if start.startswith(OPEN) or OPEN.startswith(start):
            return ""
        self.deciding, held, self.text = False, self.text, ""
        return held
