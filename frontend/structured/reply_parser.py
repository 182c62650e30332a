"""A chat reply read as the served model writes it: its thinking, its text, its tool calls.

What a surface needs, whatever the model: ``ChatTemplate.reply_parser`` makes the
``ReplyParser`` of one request (the template's tool syntax and reasoning tags, whether tools
were offered, whether the prompt opened a reasoning block), and the parser reads a whole reply
(``parse``) or a stream of it (``stream``). A whole reply is read as one piece of a stream, so
the two always agree.

In a stream, thinking (``structured.reasoning``) and text go out as they come, and so do
tool calls: from where they may begin (the family's marker, or the first call at the start
of the reply) the text is held and read as calls as it comes (``CallDelta``: a call's name
once it is written, then its arguments' JSON text piece by piece); at the end the held text
is parsed whole, which is what the reply's calls are (with the ids the stream gave them). A
reply that holds no calls there after all gets that text back as content, as it was
written.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import NamedTuple

from tinyserve.frontend.models.chat import FinishReason
from tinyserve.frontend.models.tools import ToolCall
from tinyserve.frontend.structured.reasoning import ReasoningSplit, ReasoningTags, held_from
from tinyserve.frontend.structured.tool_calls import parse_calls
from tinyserve.frontend.structured.tool_syntax import ToolSyntax


@dataclass(frozen=True)
class CallDelta:
    """A tool call as it is written: its start (``name`` and ``id``), or more of its
    arguments' JSON text (``arguments``)."""

    index: int
    id: str = ""
    name: str = ""
    arguments: str = ""


class Parts(NamedTuple):
    """What of a reply may be sent now."""

    reasoning: str
    content: str
    calls: tuple[CallDelta, ...] = ()


@dataclass(frozen=True)
class ParsedReply:
    """A reply read whole (or what a stream sends at its end): ``reason`` is ``tool_calls``
    when it calls tools, ``length`` when ``max_tokens`` cut it (a further call short)."""

    content: str
    reasoning: str
    calls: list[ToolCall]
    reason: FinishReason


@dataclass(frozen=True)
class ReplyParser:
    """How one request's reply is read: ``tools`` the syntax of its calls (None: no tools
    offered), ``reasoning`` the tags around its thinking (None: ``--reasoning-format none``,
    thinking stays in the content), ``opened`` the prompt ends inside a reasoning block."""

    tools: ToolSyntax | None = None
    reasoning: ReasoningTags | None = None
    opened: bool = False

    @property
    def grammar_prefix(self) -> str:
        """What a grammar the server builds makes the reply begin with: the close of a block
        the prompt opened (there is no thinking where a grammar holds from the first token)."""
        return f"{self.reasoning.close}\n\n" if self.opened and self.reasoning else ""

    def stream(self) -> ReplyStream:
        return ReplyStream(self)

    def parse(self, text: str, reason: FinishReason) -> ParsedReply:
        """The whole reply ``text``, which ended for ``reason``."""
        stream = self.stream()
        stream.feed(text)
        tail = stream.end(reason)
        return ParsedReply(stream.content, stream.reasoning, tail.calls, tail.reason)


class ReplyStream:
    """One reply read as its text comes (``feed``), then ended (``end``); it keeps the
    thinking and text it gave out, and counts the calls whose start it gave."""

    def __init__(self, parser: ReplyParser) -> None:
        reasoning = parser.reasoning
        self._split = None if reasoning is None else ReasoningSplit(reasoning, parser.opened)
        self._hold = None if parser.tools is None else _CallHold(parser.tools)
        self.reasoning = ""  # the thinking given out so far
        self.content = ""  # the text given out so far
        self.started = 0  # tool calls whose start was given out as they were written

    def feed(self, text: str) -> Parts:
        """What of the reply so far may be sent, given its next ``text``."""
        thinking, answer = ("", text) if self._split is None else self._split.feed(text)
        parts = Parts(thinking, answer)
        if self._hold is not None:
            parts = Parts(thinking, self._hold.feed(answer), self._hold.stream())
        self._gave(parts.reasoning, parts.content)
        self.started += sum(1 for delta in parts.calls if delta.name)
        return parts

    def end(self, reason: FinishReason) -> ParsedReply:
        """What was held back, and the calls, once the reply ended for ``reason``."""
        thinking, answer = ("", "") if self._split is None else self._split.end()
        calls: list[ToolCall] = []
        if self._hold is not None:
            answer, cut = self._hold.feed(answer), reason == "length"
            rest, calls = self._hold.end(cut)
            answer += rest
            reason = reason if cut or not calls else "tool_calls"
        self._gave(thinking, answer)
        return ParsedReply(answer, thinking, calls, reason)

    def _gave(self, reasoning: str, content: str) -> None:
        self.reasoning += reasoning
        self.content += content


class _CallHold:
    """A reply's answer as it comes: text goes on at once, but for what may be the start of
    tool calls; from where they begin, the rest is held and read as calls at the end."""

    def __init__(self, syntax: ToolSyntax) -> None:
        self._syntax = syntax
        self._held = ""
        self._calls = False  # the held text is where calls begin
        self._started = False  # text that is no call came first
        self._gap = ""  # whitespace between that text and the calls (back if they are none)
        self._stream = _CallStream(syntax)

    def feed(self, text: str) -> str:
        self._held += text
        if self._calls:
            return ""
        starts = self._syntax.starts
        if not self._started:
            head = self._held.lstrip()
            if any(head.startswith(start) for start in starts):
                self._calls = True
                return ""
            if any(start.startswith(head) for start in starts):
                return ""  # only whitespace yet, or maybe the start of a call
            self._started = True
        if not self._syntax.leading_text:
            sent, self._held = self._held, ""
            return sent
        at = self._held.find(self._syntax.anchor)
        if at >= 0:
            sent = self._held[:at].rstrip()
            self._gap, self._held, self._calls = self._held[len(sent) : at], self._held[at:], True
            return sent
        keep = held_from(self._held, self._syntax.anchor)
        sent, self._held = self._held[:keep], self._held[keep:]
        return sent

    def stream(self) -> tuple[CallDelta, ...]:
        """What more of the calls has been written since the last time."""
        return self._stream.read(self._held) if self._calls else ()

    def end(self, cut: bool) -> tuple[str, list[ToolCall]]:
        """The text still held (none when it is calls), and the calls (with the ids the
        stream gave those it started)."""
        calls = parse_calls(self._held, self._syntax, cut) if self._calls else []
        ids = self._stream.ids
        calls = [c.model_copy(update={"id": ids[i]}) if i < len(ids) else c
                 for i, c in enumerate(calls)]  # fmt: skip
        return ("", calls) if calls else (self._gap + self._held, [])


# The head of a call as the grammar writes it (and as models write it): its name, complete,
# then the arguments' key; what follows is the arguments' JSON value.
_HEAD = re.compile(r'\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(?:arguments|parameters)"\s*:\s*')


class _CallStream:
    """Reads held calls as they are written: each call's head (its name) once complete, then
    its arguments' JSON text up to where that value ends (its brackets balanced)."""

    def __init__(self, syntax: ToolSyntax) -> None:
        self._syntax = syntax
        self.ids: list[str] = []  # of the calls started, in order
        self._pos = 0  # how far the held text was read
        self._in_arguments = False
        self._value_began = False
        self._depth = 0
        self._in_string = False
        self._escaped = False

    def read(self, held: str) -> tuple[CallDelta, ...]:
        deltas: list[CallDelta] = []
        while self._pos < len(held):
            if not self._in_arguments:
                head = _HEAD.search(held, self._pos)
                if head is None:
                    break
                self.ids.append(self._syntax.mint_id())
                name = json.loads(f'"{head.group(1)}"')
                deltas.append(CallDelta(len(self.ids) - 1, self.ids[-1], name))
                self._pos, self._in_arguments, self._value_began = head.end(), True, False
                continue
            if not self._value_began:  # a head read at the end of the text leaves its space
                rest = held[self._pos :]
                self._pos += len(rest) - len(rest.lstrip())
                self._value_began = self._pos < len(held)
            start = self._pos
            done = self._value(held)
            if self._pos > start:
                deltas.append(CallDelta(len(self.ids) - 1, arguments=held[start : self._pos]))
            if not done:
                break
            self._in_arguments = False
        return tuple(deltas)

    def _value(self, held: str) -> bool:
        """Read on through the arguments' value; whether it ended."""
        while self._pos < len(held):
            char = held[self._pos]
            if self._in_string:
                if self._escaped:
                    self._escaped = False
                elif char == "\\":
                    self._escaped = True
                elif char == '"':
                    self._in_string = False
            elif char == '"':
                self._in_string = True
            elif char in "{[":
                self._depth += 1
            elif char in "}]" or (char == "," and self._depth == 0):
                if self._depth == 0:  # a bare value's end: the call's own comma or brace
                    return True
                self._depth -= 1
                if self._depth == 0:
                    self._pos += 1
                    return True
            self._pos += 1
        return False
