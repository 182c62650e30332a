"""The JSON-schema-to-GBNF converter, checked by llama.cpp's own grammar engine: a text is in
the grammar's language when every one of its tokens is allowed in turn and the end is then
allowed too (the same verdict the engine's sampler acts on)."""

from __future__ import annotations

import ctypes
import json
from collections.abc import Callable, Iterator
from typing import Any

import jsonschema
import llama_cpp
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tinyserve.frontend.structured.json_schema import SchemaError, schema_to_grammar
from tinyserve.model import resolve_model_path

Accepts = Callable[[str, str], bool]


def grammar_of(schema: Any) -> str:
    grammar, unenforced = schema_to_grammar(schema)
    assert unenforced == [], unenforced
    return grammar


@pytest.fixture(scope="module")
def accepts() -> Iterator[Accepts]:
    llama = llama_cpp.Llama(str(resolve_model_path(None)), vocab_only=True, verbose=False)
    vocab = llama_cpp.llama_model_get_vocab(llama.model)
    eos = llama.token_eos()

    def allowed(grammar: Any, token: int) -> bool:
        cell = llama_cpp.llama_token_data(token, 0.0, 0.0)
        array = llama_cpp.llama_token_data_array(ctypes.pointer(cell), 1, -1, False)
        llama_cpp.llama_sampler_apply(grammar, ctypes.byref(array))
        return cell.logit != float("-inf")

    def check(grammar_text: str, text: str) -> bool:
        grammar = llama_cpp.llama_sampler_init_grammar(vocab, grammar_text.encode(), b"root")
        assert grammar, grammar_text
        try:
            for token in llama.tokenize(text.encode(), add_bos=False, special=False):
                if not allowed(grammar, token):
                    return False
                llama_cpp.llama_sampler_accept(grammar, token)
            return allowed(grammar, eos)
        finally:
            llama_cpp.llama_sampler_free(grammar)

    yield check
    llama.close()


bounds = st.one_of(st.none(), st.integers(-1200, 1200))


def test_a_bound_of_more_digits_than_the_integer_rule_holds(accepts: Accepts) -> None:
    # An open range from 10^17 + 3 was "[0-9]{18,15}": llama.cpp's parser took it as a
    # repetition without end and the process that built the grammar ran out of memory.
    low = 10**17 + 3
    grammar, _ = schema_to_grammar({"type": "integer", "minimum": low})
    assert accepts(grammar, str(low)) and accepts(grammar, str(10**18 + 5))
    assert not accepts(grammar, str(low - 1))
    grammar, _ = schema_to_grammar({"type": "integer", "maximum": -low})
    assert accepts(grammar, str(-low)) and not accepts(grammar, str(-low + 1))


@settings(max_examples=150, deadline=None)
@given(low=bounds, high=bounds, value=st.integers(-1500, 1500))
def test_integer_bounds_are_exact(accepts: Accepts, low: Any, high: Any, value: int) -> None:
    if low is not None and high is not None and low > high:
        low, high = high, low
    schema: dict[str, Any] = {"type": "integer"}
    if low is not None:
        schema["minimum"] = low
    if high is not None:
        schema["maximum"] = high
    inside = (low is None or value >= low) and (high is None or value <= high)
    assert accepts(grammar_of(schema), str(value)) == inside


@settings(max_examples=100, deadline=None)
@given(
    low=st.integers(-30, 30),
    span=st.integers(0, 60),
    value=st.decimals(-100, 100, places=2, allow_nan=False, allow_infinity=False),
)
def test_number_bounds_are_exact(accepts: Accepts, low: int, span: int, value: Any) -> None:
    schema = {"type": "number", "minimum": low, "maximum": low + span}
    text = format(value, "f")
    assert accepts(grammar_of(schema), text) == (low <= value <= low + span)


SCHEMA = {
    "$defs": {"Tag": {"type": "string", "enum": ["a", "b"]}},
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 3},
        "tags": {"type": "array", "items": {"$ref": "#/$defs/Tag"}, "maxItems": 2},
        "n": {"type": ["integer", "null"]},
    },
    "required": ["name"],
}


@pytest.mark.parametrize(
    "value",
    [
        {"name": "ab"},
        {"name": "", "tags": ["a", "b"]},
        {"name": "abcd"},
        {"name": "x", "tags": ["a", "b", "a"]},
        {"name": "x", "tags": ["c"]},
        {"name": "x", "n": None},
        {"name": "x", "n": 1.5},
        {"tags": []},
        {"name": "x", "other": 1},
    ],
)
def test_grammar_and_jsonschema_agree(accepts: Accepts, value: Any) -> None:
    valid = jsonschema.Draft202012Validator(SCHEMA).is_valid(value)
    if "other" in value:
        valid = False  # extra properties are never generated (additionalProperties defaults)
    assert accepts(grammar_of(SCHEMA), json.dumps(value, separators=(",", ":"))) == valid


MAP = {"type": "object", "additionalProperties": {"type": "integer", "minimum": 0}}


@pytest.mark.parametrize(
    "value", [{}, {"a": 1}, {"a": 1, "b": 20}, {"a": -1}, {"a": "1"}, {"a": 1, "b": None}, []]
)
def test_a_schema_for_additional_properties_holds_for_every_member(
    accepts: Accepts, value: Any
) -> None:
    valid = jsonschema.Draft202012Validator(MAP).is_valid(value)
    assert accepts(grammar_of(MAP), json.dumps(value, separators=(",", ":"))) == valid


@pytest.mark.parametrize(
    ("schema", "unenforced"),
    [
        ({"type": "string", "pattern": "a+"}, ["/: pattern"]),
        ({"type": "string", "format": "email"}, ["/: format"]),
        ({"properties": {"x": {"type": "number", "minimum": 0.5}}},
         ["/properties/x: minimum"]),
        ({"$ref": "https://example.invalid/s.json"}, ["/: $ref"]),
        ({"allOf": [{"type": "string"}, {"maxLength": 2}]}, ["/allOf/1: allOf"]),
        ({"type": "thing"}, ['/type: type "thing"']),
        ({"type": {"not": "a type"}}, ['/type: type {"not": "a type"}']),
        ({"type": "object", "properties": {"a": {}}, "additionalProperties": {"type": "string"}},
         ["/: additionalProperties"]),
        ({"type": "integer", "minimum": float("inf")}, ["/: minimum"]),
        ({"type": "string", "propertyNames": {"pattern": "x"}, "not": {}},
         ["/: not", "/: propertyNames"]),
    ],
)  # fmt: skip
def test_what_a_grammar_cannot_enforce_is_listed_not_refused(
    accepts: Accepts, schema: Any, unenforced: list[str]
) -> None:
    grammar, listed = schema_to_grammar(schema)
    assert listed == unenforced
    assert accepts(grammar, '"ab"') or accepts(grammar, "{}") or accepts(grammar, "1")


def test_required_without_a_schema_is_any_value(accepts: Accepts) -> None:
    grammar = grammar_of({"type": "object", "required": ["x"]})
    assert accepts(grammar, '{"x":[1]}')
    assert not accepts(grammar, "{}")


@pytest.mark.parametrize(
    ("schema", "says"),
    [
        ({"$ref": "#/$defs/Missing"}, "is not defined"),
        ({"type": "object", "properties": {"a": 3}}, "a schema must be an object"),
        ({"enum": "a"}, "'enum' must be a non-empty list"),
        ({"type": "object", "required": [{"x": 1}]}, "a list of property names"),
        ({"type": "array", "prefixItems": 3}, "a list of schemas"),
        ({"type": "integer", "minimum": 3, "maximum": 1}, "no number lies between"),
    ],
)  # fmt: skip
def test_what_is_no_schema_is_named(schema: Any, says: str) -> None:
    with pytest.raises(SchemaError) as caught:
        schema_to_grammar(schema)
    assert says in str(caught.value)


def test_a_schema_nested_too_deep_is_refused_not_a_crash() -> None:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(400):
        schema = {"type": "array", "items": schema}
    with pytest.raises(SchemaError) as caught:
        schema_to_grammar(schema)
    assert "nested more than" in str(caught.value)


KEYWORDS = st.sampled_from([
    "type", "properties", "required", "additionalProperties", "items", "prefixItems", "enum",
    "const", "anyOf", "oneOf", "allOf", "$ref", "$defs", "minimum", "maximum",
    "exclusiveMinimum", "minLength", "maxLength", "minItems", "maxItems", "format", "pattern",
    "not", "propertyNames",
])  # fmt: skip
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.floats(allow_nan=False)
    | st.sampled_from(["object", "array", "string", "integer", "number", "x", "#/$defs/a"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        KEYWORDS | st.sampled_from(["a", "b"]), inner, max_size=4),
    max_leaves=20,
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(schema=JSON_VALUES)
@example(schema={"$ref": "#/$defs/a", "$defs": [1]})
@example(schema={"$ref": "#/$defs/a", "$defs": {"a": 3}})
@example(schema={"type": "object", "properties": {"a": {}}, "required": "a"})
@example(schema={"type": "array", "minItems": True, "items": [{"type": {}}]})
@example(schema={"anyOf": {}, "enum": [{"a": [1]}]})
@example(schema={"type": "integer", "minimum": "3", "exclusiveMaximum": True})
@example(schema={"type": "string", "minLength": None, "maxLength": 3})
@example(schema={"type": "integer", "minimum": 1e18})  # [0-9]{19,15}: memory ran out
@example(schema={"type": "number", "maximum": -1.5e40})
def test_any_json_as_a_schema_is_a_grammar_that_compiles_or_a_schema_error(
    accepts: Accepts, schema: Any
) -> None:
    # What a client may send as a tool's parameters: never a crash (a 500), and a grammar
    # built from it is one llama.cpp takes.
    try:
        grammar, _ = schema_to_grammar(schema)
    except SchemaError:
        return
    accepts(grammar, "{}")  # the fixture asserts the grammar compiles
