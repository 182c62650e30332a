"""The generic tool-call format: its grammar (checked by llama.cpp's grammar engine), the
parser of replies, and the stream's hold-back of a reply that may be a call."""

from __future__ import annotations

import json

import pytest

from tinyserve.frontend.http.api_errors import ApiError
from tinyserve.frontend.models.tools import NamedToolChoice, Tool
from tinyserve.frontend.structured import tool_calls

from .test_json_schema import Accepts, accepts  # noqa: F401  (the fixture)

WEATHER = Tool.model_validate({
    "type": "function",
    "function": {"name": "get_weather", "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 20},
                       "unit": {"enum": ["C", "F"]}},
        "required": ["city"],
    }},
})  # fmt: skip
TIME = Tool.model_validate({"type": "function", "function": {"name": "get_time"}})


def call(name: str, arguments: object) -> str:
    body = json.dumps({"name": name, "arguments": arguments})
    return f"<tool_call>\n{body}\n</tool_call>"


def test_required_admits_only_valid_calls(accepts: Accepts) -> None:  # noqa: F811
    grammar = tool_calls.tools_grammar([WEATHER, TIME], "required", parallel=True)
    paris = call("get_weather", {"city": "Paris", "unit": "C"})
    assert accepts(grammar, paris)
    assert accepts(grammar, paris + "\n" + call("get_time", {}))
    assert not accepts(grammar, call("get_weather", {"unit": "C"}))  # city is required
    assert not accepts(grammar, call("get_weather", {"city": "Paris", "unit": "K"}))
    assert not accepts(grammar, call("delete_all", {}))
    assert not accepts(grammar, "Sunny in Paris.")
    single = tool_calls.tools_grammar([WEATHER, TIME], "required", parallel=False)
    assert not accepts(single, paris + "\n" + call("get_time", {}))


def test_named_choice_and_auto(accepts: Accepts) -> None:  # noqa: F811
    named = NamedToolChoice.model_validate({"type": "function", "function": {"name": "get_time"}})
    grammar = tool_calls.tools_grammar([WEATHER, TIME], named, parallel=True)
    assert accepts(grammar, call("get_time", {"zone": "UTC"}))
    assert not accepts(grammar, call("get_weather", {"city": "Paris"}))
    auto = tool_calls.tools_grammar([WEATHER, TIME], "auto", parallel=True)
    assert accepts(auto, call("get_weather", {"city": "Oslo"}))
    assert accepts(auto, "It is sunny.")
    assert not accepts(auto, "<tool_call>\n{oops")


def test_parameters_that_cannot_be_enforced_are_a_400_naming_tools() -> None:
    bad = Tool.model_validate({"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"type": "string", "pattern": "a"}}}}})  # fmt: skip
    with pytest.raises(ApiError) as caught:
        tool_calls.tools_grammar([bad], "required", parallel=True)
    assert caught.value.param == "tools" and "'pattern'" in caught.value.message


def test_replies_parse_into_calls_or_stay_text() -> None:
    two = call("get_weather", {"city": "Rome"}) + "\n" + call("get_time", {})
    message, reason = tool_calls.reply_message(two, "stop")
    assert reason == "tool_calls" and message.content is None
    assert [c.function.name for c in message.tool_calls or []] == ["get_weather", "get_time"]
    assert json.loads((message.tool_calls or [])[0].function.arguments) == {"city": "Rome"}
    assert len({c.id for c in message.tool_calls or []}) == 2
    for text in ("Hello", '<tool_call>\n{"name": "get_time", "argu', call("f", {}) + " and"):
        message, reason = tool_calls.reply_message(text, "length")
        assert (message.content, message.tool_calls, reason) == (text, None, "length")
    # max_tokens cut a second call short: the first, complete, is kept; the reason says cut.
    for tail in ('\n<tool_call>\n{"name": "get_ti', "\n<tool_", "\n<tool_call>"):
        message, reason = tool_calls.reply_message(call("f", {"x": 1}) + tail, "length")
        assert [c.function.name for c in message.tool_calls or []] == ["f"]
        assert (message.content, reason) == (None, "length")
        # Not cut, the same text is no list of calls.
        message, reason = tool_calls.reply_message(call("f", {"x": 1}) + tail, "stop")
        assert message.tool_calls is None and reason == "stop"


def test_stream_holds_back_only_what_may_be_a_call() -> None:
    held = tool_calls.HeldText()
    assert [held.feed(t) for t in (" <tool", "_call>\n{", '"name"')] == ["", "", ""]
    assert held.text == ' <tool_call>\n{"name"'
    plain = tool_calls.HeldText()
    assert [plain.feed(t) for t in ("<to", "ast", "!")] == ["", "<toast", "!"]
