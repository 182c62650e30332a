"""A reply read whole and as a stream: thinking, text and tool calls together, the same
however the stream's pieces fall."""

from __future__ import annotations

from itertools import pairwise

from hypothesis import example, given
from hypothesis import strategies as st

from tinyserve.frontend.models.chat import FinishReason
from tinyserve.frontend.structured.reasoning import THINK
from tinyserve.frontend.structured.reply_parser import ParsedReply, ReplyParser
from tinyserve.frontend.structured.tool_syntax import GENERIC, HERMES, LLAMA3, MISTRAL

QWEN = ReplyParser(HERMES, THINK)
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def streamed(parser: ReplyParser, pieces: list[str], reason: FinishReason) -> ParsedReply:
    """What a stream sends in all, its pieces' parts and its end's joined (and what the
    stream keeps of it)."""
    stream = parser.stream()
    sent = [stream.feed(piece) for piece in pieces]
    end = stream.end(reason)
    reasoning = "".join(p.reasoning for p in sent) + end.reasoning
    content = "".join(p.content for p in sent) + end.content
    assert (stream.content, stream.reasoning) == (content, reasoning)  # what it says it gave
    assert stream.started == sum(1 for p in sent for delta in p.calls if delta.name)
    return ParsedReply(content, reasoning, end.calls, end.reason)


def test_thinking_text_and_calls() -> None:
    reply = QWEN.parse(f"<think>\nParis, then.\n</think>\n\nLet me look.\n{CALL}", "stop")
    assert (reply.reasoning, reply.content, reply.reason) == (
        "Paris, then.",
        "Let me look.",
        "tool_calls",
    )
    assert [c.function.name for c in reply.calls] == ["get_weather"]
    cut = QWEN.parse(f"{CALL}\n<tool_call>\n{{", "length")
    assert (len(cut.calls), cut.content, cut.reason) == (1, "", "length")


def test_what_looked_like_calls_comes_back_as_written() -> None:
    for text in ("Use <tool_call> tags.", "Hi\n\n<tool_call>\n{oops}\n</tool_call>", "  <tool"):
        assert QWEN.parse(text, "stop") == ParsedReply(text, "", [], "stop")
    # Llama 3's and Mistral's calls open the reply; the same JSON after text is text.
    for syntax, text in (
        (LLAMA3, 'See {"name": "f", "parameters": {}}'),
        (MISTRAL, 'x [{"name": "f"}]'),
    ):
        assert ReplyParser(syntax).parse(text, "stop").calls == []
    # The generic format has no text before its calls.
    assert ReplyParser(GENERIC).parse(f"Sure.\n{CALL}", "stop").calls == []


def test_no_tools_no_reasoning_reads_plain_text() -> None:
    text = f"<think>x</think>{CALL}"
    assert ReplyParser().parse(text, "length") == ParsedReply(text, "", [], "length")


def test_a_stream_sends_text_at_once_and_holds_a_call_until_it_is_one() -> None:
    stream = QWEN.stream()
    pieces = ["<think>", "Hm", "</think>", "\n\nSure", ".\n<tool", "_call>\n{", '"name"']
    sent = [tuple(stream.feed(piece))[:2] for piece in pieces]
    assert sent == [("", ""), ("Hm", ""), ("", ""), ("", "Sure"), ("", "."), ("", ""), ("", "")]
    end = stream.end("length")  # the call never finished: its text is content after all
    assert (end.content, end.calls, end.reason) == ('\n<tool_call>\n{"name"', [], "length")


def test_grammars_built_for_an_opened_block_close_it_first() -> None:
    assert ReplyParser(HERMES, THINK, opened=True).grammar_prefix == "</think>\n\n"
    assert ReplyParser(HERMES, THINK).grammar_prefix == ""
    assert ReplyParser(HERMES, None, opened=True).grammar_prefix == ""


FRAGMENTS = st.sampled_from([
    "<think>", "</think>", "<tool_call>", "</tool_call>", "[TOOL_CALLS]", "<|python_tag|>",
    '{"name": "f", "arguments": {}}', '{"name": "g", "parameters": {"x": 1}}', "[", "]", ", ",
    "; ", "\n", " ", "ok", "<", "{",
])  # fmt: skip
PARSERS = st.builds(
    ReplyParser,
    st.sampled_from([None, GENERIC, HERMES, LLAMA3, MISTRAL]),
    st.sampled_from([None, THINK]),
    st.booleans(),
)


@given(PARSERS, st.lists(FRAGMENTS, max_size=12), st.lists(st.integers(0, 200)), st.booleans())
def test_a_stream_sends_what_the_whole_reply_holds(
    parser: ReplyParser, fragments: list[str], cuts: list[int], was_cut: bool
) -> None:
    text = "".join(fragments)
    bounds = sorted({0, len(text), *(c for c in cuts if c < len(text))})
    pieces = [text[a:b] for a, b in pairwise(bounds)]
    reason: FinishReason = "length" if was_cut else "stop"
    whole, stream = parser.parse(text, reason), streamed(parser, pieces, reason)
    assert [c.function for c in stream.calls] == [c.function for c in whole.calls]
    assert (stream.content, stream.reasoning, stream.reason) == (
        whole.content, whole.reasoning, whole.reason
    )  # fmt: skip
    if not whole.calls and parser.reasoning is None:
        assert whole.content == text  # nothing is lost


TWO_CALLS = (
    'Looking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa\\"ris}", '
    '"days": [1, {"a": 2}]}}\n</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {}}'
    "\n</tool_call>"
)


@given(st.lists(st.integers(0, len(TWO_CALLS)), max_size=12))
@example([TWO_CALLS.index('"arguments": ') + len('"arguments":')])  # a piece ends at the colon
def test_calls_stream_as_they_are_written_however_the_pieces_fall(cuts: list[int]) -> None:
    bounds = [0, *sorted(cuts), len(TWO_CALLS)]
    stream = ReplyParser(HERMES).stream()
    deltas = [d for a, b in pairwise(bounds) for d in stream.feed(TWO_CALLS[a:b]).calls]
    end = stream.end("stop")
    starts = [d for d in deltas if d.name]
    assert [(d.index, d.name) for d in starts] == [(0, "get_weather"), (1, "get_time")]
    assert stream.started == 2
    # Each call's arguments, streamed piece by piece, are the text the reply's call holds
    # (wherever a piece ends: after the head's colon, the value's space is no part of it),
    # and the reply's calls carry the ids the stream gave them.
    for call, start in zip(end.calls, starts, strict=True):
        text = "".join(d.arguments for d in deltas if d.index == start.index and not d.name)
        assert text == call.function.arguments
        assert call.id == start.id
    assert end.reason == "tool_calls"


def test_text_that_is_no_call_streams_no_call() -> None:
    stream = ReplyParser(GENERIC).stream()
    parts = [stream.feed(piece) for piece in ["<tool_", "call>\nnot a call", " at all"]]
    assert not any(p.calls for p in parts)
    assert stream.end("stop").calls == []
