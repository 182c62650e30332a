"""A chat reply read as the served model writes it: its thinking, its text, its tool calls.

What a surface needs, whatever the model: ``ChatTemplate.reply_parser`` makes the
``ReplyParser`` of one request (the template's tool syntax and reasoning tags, whether tools
were offered, whether the prompt opened a reasoning block), and the parser reads a whole reply
(``parse``) or a stream of it (``stream``). A whole reply is read as one piece of a stream, so
the two always agree.

In a stream, thinking (``structured.reasoning``) and text go out as they come. Tool calls
come out whole at the end: from where they may begin (the family's marker, or the first call
at the start of the reply) the text is held; a reply that holds no calls there after all
gets that text back as content, as it was written.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from tinyserve.frontend.models.openai_replies import FinishReason, ToolCall
from tinyserve.frontend.structured.reasoning import ReasoningSplit, ReasoningTags, held_from
from tinyserve.frontend.structured.tool_calls import parse_calls
from tinyserve.frontend.structured.tool_syntax import ToolSyntax


class Parts(NamedTuple):
    """What of a reply may be sent now."""

    reasoning: str
    content: str


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
        head = stream.feed(text)
        tail = stream.end(reason)
        content, reasoning = head.content + tail.content, head.reasoning + tail.reasoning
        return ParsedReply(content, reasoning, tail.calls, tail.reason)


class ReplyStream:
    """One reply read as its text comes (``feed``), then ended (``end``)."""

    def __init__(self, parser: ReplyParser) -> None:
        reasoning = parser.reasoning
        self._split = None if reasoning is None else ReasoningSplit(reasoning, parser.opened)
        self._hold = None if parser.tools is None else _CallHold(parser.tools)

    def feed(self, text: str) -> Parts:
        """What of the reply so far may be sent, given its next ``text``."""
        thinking, answer = ("", text) if self._split is None else self._split.feed(text)
        return Parts(thinking, answer if self._hold is None else self._hold.feed(answer))

    def end(self, reason: FinishReason) -> ParsedReply:
        """What was held back, and the calls, once the reply ended for ``reason``."""
        thinking, answer = ("", "") if self._split is None else self._split.end()
        if self._hold is None:
            return ParsedReply(answer, thinking, [], reason)
        answer = self._hold.feed(answer)
        cut = reason == "length"
        rest, calls = self._hold.end(cut)
        return ParsedReply(
            answer + rest, thinking, calls, reason if cut or not calls else "tool_calls"
        )


class _CallHold:
    """A reply's answer as it comes: text goes on at once, but for what may be the start of
    tool calls; from where they begin, the rest is held and read as calls at the end."""

    def __init__(self, syntax: ToolSyntax) -> None:
        self._syntax = syntax
        self._held = ""
        self._calls = False  # the held text is where calls begin
        self._started = False  # text that is no call came first
        self._gap = ""  # whitespace between that text and the calls (back if they are none)

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

    def end(self, cut: bool) -> tuple[str, list[ToolCall]]:
        """The text still held (none when it is calls), and the calls."""
        calls = parse_calls(self._held, self._syntax, cut) if self._calls else []
        return ("", calls) if calls else (self._gap + self._held, [])
