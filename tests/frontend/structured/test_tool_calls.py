"""Tool calls in each syntax: the grammar (checked by llama.cpp's grammar engine) admits the
family's calls and nothing else, and the parser reads them back, as models write them."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tinyserve.frontend.models.errors import ApiError
from tinyserve.frontend.models.tools import NamedToolChoice, Tool
from tinyserve.frontend.structured import tool_calls
from tinyserve.frontend.structured.tool_syntax import GENERIC, HERMES, LLAMA3, MISTRAL, ToolSyntax

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
    """One call in the generic format (Hermes's)."""
    body = json.dumps({"name": name, "arguments": arguments})
    return f"<tool_call>\n{body}\n</tool_call>"


def calls_in(syntax: ToolSyntax, *calls: tuple[str, object]) -> str:
    """``calls`` as the grammar of ``syntax`` writes them."""
    bodies = [
        syntax.call_open
        + json.dumps({"name": name, syntax.arguments_key: arguments})
        + syntax.call_close
        for name, arguments in calls
    ]
    opening = (syntax.marker if syntax.writes_marker else "") + syntax.list_open
    return opening + syntax.separator.join(bodies) + syntax.list_close


def grammar_of(*args: Any, **kwargs: Any) -> str:
    grammar, unenforced = tool_calls.tools_grammar(*args, **kwargs)
    assert unenforced == []
    return grammar


def names(text: str, syntax: ToolSyntax = GENERIC, cut: bool = False) -> list[str]:
    return [c.function.name for c in tool_calls.parse_calls(text, syntax, cut)]


def test_required_admits_only_valid_calls(accepts: Accepts) -> None:  # noqa: F811
    grammar = grammar_of([WEATHER, TIME], "required", parallel=True)
    paris = call("get_weather", {"city": "Paris", "unit": "C"})
    assert accepts(grammar, paris)
    assert accepts(grammar, paris + "\n" + call("get_time", {}))
    assert not accepts(grammar, call("get_weather", {"unit": "C"}))  # city is required
    assert not accepts(grammar, call("get_weather", {"city": "Paris", "unit": "K"}))
    assert not accepts(grammar, call("delete_all", {}))
    assert not accepts(grammar, "Sunny in Paris.")
    single = grammar_of([WEATHER, TIME], "required", parallel=False)
    assert not accepts(single, paris + "\n" + call("get_time", {}))


def test_named_choice_and_auto(accepts: Accepts) -> None:  # noqa: F811
    named = NamedToolChoice.model_validate({"type": "function", "function": {"name": "get_time"}})
    grammar = grammar_of([WEATHER, TIME], named, parallel=True)
    assert accepts(grammar, call("get_time", {"zone": "UTC"}))
    assert not accepts(grammar, call("get_weather", {"city": "Paris"}))
    auto = grammar_of([WEATHER, TIME], "auto", parallel=True)
    assert accepts(auto, call("get_weather", {"city": "Oslo"}))
    assert accepts(auto, "It is sunny.")
    assert not accepts(auto, "<tool_call>\n{oops")


@pytest.mark.parametrize("syntax", [HERMES, LLAMA3, MISTRAL], ids=lambda s: s.family)
def test_each_family_grammar_writes_its_own_syntax(
    accepts: Accepts,  # noqa: F811
    syntax: ToolSyntax,
) -> None:
    paris = ("get_weather", {"city": "Paris"})
    grammar = grammar_of([WEATHER, TIME], "required", True, syntax)
    assert accepts(grammar, calls_in(syntax, paris))
    assert not accepts(grammar, calls_in(syntax, ("get_weather", {"unit": "C"})))
    other = MISTRAL if syntax is not MISTRAL else HERMES
    assert not accepts(grammar, calls_in(other, paris))
    # A Llama 3 template renders one call per message: a reply holds one.
    two = calls_in(syntax, paris, ("get_time", {}))
    assert accepts(grammar, two) == (not syntax.single_call)
    auto = grammar_of([WEATHER, TIME], "auto", True, syntax)
    assert accepts(auto, calls_in(syntax, paris)) and accepts(auto, "It is sunny.")
    # Text that starts like a call must be one.
    assert not any(accepts(auto, start + "oops") for start in syntax.starts)


def test_what_parameters_cannot_enforce_is_listed_and_the_rest_holds(
    accepts: Accepts,  # noqa: F811
) -> None:
    loose = Tool.model_validate({"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"type": "string", "pattern": "a", "format": "uri"}},
        "required": ["x"]}}})  # fmt: skip
    grammar, unenforced = tool_calls.tools_grammar([loose], "required", parallel=True)
    assert unenforced == ["function f: /properties/x: format", "function f: /properties/x: pattern"]
    assert accepts(grammar, call("f", {"x": "b"}))
    assert not accepts(grammar, call("f", {}))


def test_no_schema_is_a_400_naming_tools() -> None:
    bad = Tool.model_validate({"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": "string"}}}})  # fmt: skip
    with pytest.raises(ApiError) as caught:
        tool_calls.tools_grammar([bad], "required", parallel=True)
    assert caught.value.param == "tools" and "must be an object" in caught.value.message


def test_one_tool_may_be_called_several_times(accepts: Accepts) -> None:  # noqa: F811
    grammar = grammar_of([TIME], "required", parallel=True)
    assert accepts(grammar, "\n".join([call("get_time", {})] * tool_calls.MIN_CALLS))
    assert not accepts(grammar, "\n".join([call("get_time", {})] * (tool_calls.MIN_CALLS + 1)))


def test_auto_with_an_answer_format_is_a_call_or_that_answer(accepts: Accepts) -> None:  # noqa: F811
    from tinyserve.frontend.structured.json_schema import schema_rules

    answer = schema_rules({"type": "object", "properties": {"ok": {"type": "boolean"}},
                           "required": ["ok"]}, "a")  # fmt: skip
    grammar = grammar_of([WEATHER], "auto", parallel=True, answer=answer)
    assert accepts(grammar, call("get_weather", {"city": "Oslo"}))
    assert accepts(grammar, '{"ok": true}')
    assert not accepts(grammar, "It is sunny.")


def test_generic_calls_parse_or_stay_text() -> None:
    two = call("get_weather", {"city": "Rome"}) + "\n" + call("get_time", {})
    parsed = tool_calls.parse_calls(two)
    assert [c.function.name for c in parsed] == ["get_weather", "get_time"]
    assert json.loads(parsed[0].function.arguments) == {"city": "Rome"}
    assert len({c.id for c in parsed}) == 2 and all(c.id.startswith("call_") for c in parsed)
    for text in ("Hello", '<tool_call>\n{"name": "get_time", "argu', call("f", {}) + " and"):
        assert names(text, cut=True) == []
    # max_tokens cut a second call short: the first, complete, is kept.
    for tail in ('\n<tool_call>\n{"name": "get_ti', "\n<tool_", "\n<tool_call>"):
        assert names(call("f", {"x": 1}) + tail, cut=True) == ["f"]
        assert names(call("f", {"x": 1}) + tail) == []  # not cut: no list of calls


# As each family's models write calls (their model cards and templates), beyond what our
# grammar writes: other spacing, the other arguments key, a marker the engine would not spell.
@pytest.mark.parametrize(
    ("syntax", "text", "expected"),
    [
        (HERMES, '<tool_call>\n{"name": "a", "arguments": {"x": 1}}\n</tool_call>\n'
                 '<tool_call>\n{"name": "b", "arguments": {}}\n</tool_call>', ["a", "b"]),
        (HERMES, '<tool_call>{"name": "a", "arguments": {}}</tool_call>', ["a"]),
        (LLAMA3, '{"name": "a", "parameters": {"x": 1}}', ["a"]),
        (LLAMA3, '<|python_tag|>{"type": "function", "name": "a", "parameters": {}}', ["a"]),
        (LLAMA3, '{"name": "a", "arguments": {}}; {"name": "b", "parameters": {}}', ["a", "b"]),
        (MISTRAL, '[TOOL_CALLS] [{"name": "a", "arguments": {"x": 1}}, {"name": "b", '
                  '"arguments": {}, "id": "abcdefghi"}]', ["a", "b"]),
        (MISTRAL, '[{"name": "a", "arguments": {}}]', ["a"]),
        (LLAMA3, '{"answer": 42}', []),
        (LLAMA3, '{"name": "a", "parameters": {}} is what I would call', []),
        (MISTRAL, '[TOOL_CALLS][{"name": "a", "arguments": {}}', []),
        (MISTRAL, "[1, 2]", []),
        (HERMES, "[" * 100_000, []),
    ],
)  # fmt: skip
def test_family_calls_parse(syntax: ToolSyntax, text: str, expected: list[str]) -> None:
    assert names(text, syntax) == expected


def test_cut_short_family_calls_keep_the_complete_ones() -> None:
    mistral = '[TOOL_CALLS][{"name": "a", "arguments": {}}, {"name": "b", "argu'
    assert names(mistral, MISTRAL, cut=True) == ["a"]
    assert names('[TOOL_CALLS][{"name": "a", "arguments": {}}', MISTRAL, cut=True) == ["a"]
    assert names('{"name": "a", "parameters": {}}; {"na', LLAMA3, cut=True) == ["a"]


def test_arguments_come_back_as_json_text_and_ids_as_the_family_takes_them() -> None:
    [mistral] = tool_calls.parse_calls('[{"name": "a", "arguments": {"é": [1]}}]', MISTRAL)
    assert mistral.function.arguments == '{"é": [1]}'
    assert len(mistral.id) == 9 and mistral.id.isalnum()  # what Mistral's template checks
    [llama] = tool_calls.parse_calls('{"name": "a", "parameters": {"k": "v"}}', LLAMA3)
    assert json.loads(llama.function.arguments) == {"k": "v"} and llama.id.startswith("call_")


def test_earlier_calls_reach_a_template_as_hugging_face_passes_them() -> None:
    from tinyserve.frontend.models.tools import ToolCallIn

    def earlier(arguments: str) -> Any:
        return tool_calls.template_call(ToolCallIn.model_validate(
            {"id": "x1", "type": "function", "function": {"name": "f", "arguments": arguments}}
        ))  # fmt: skip

    assert earlier('{"a": 1}') == {
        "id": "x1", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}
    }  # fmt: skip
    assert earlier("not json")["function"]["arguments"] == "not json"
