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
from hypothesis import given, settings
from hypothesis import strategies as st

from tinyserve.frontend.structured.json_schema import SchemaError, schema_to_grammar
from tinyserve.model import resolve_model_path

Accepts = Callable[[str, str], bool]


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
    assert accepts(schema_to_grammar(schema), str(value)) == inside


@settings(max_examples=100, deadline=None)
@given(
    low=st.integers(-30, 30),
    span=st.integers(0, 60),
    value=st.decimals(-100, 100, places=2, allow_nan=False, allow_infinity=False),
)
def test_number_bounds_are_exact(accepts: Accepts, low: int, span: int, value: Any) -> None:
    schema = {"type": "number", "minimum": low, "maximum": low + span}
    text = format(value, "f")
    assert accepts(schema_to_grammar(schema), text) == (low <= value <= low + span)


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
    assert accepts(schema_to_grammar(SCHEMA), json.dumps(value, separators=(",", ":"))) == valid


MAP = {"type": "object", "additionalProperties": {"type": "integer", "minimum": 0}}


@pytest.mark.parametrize(
    "value", [{}, {"a": 1}, {"a": 1, "b": 20}, {"a": -1}, {"a": "1"}, {"a": 1, "b": None}, []]
)
def test_a_schema_for_additional_properties_holds_for_every_member(
    accepts: Accepts, value: Any
) -> None:
    valid = jsonschema.Draft202012Validator(MAP).is_valid(value)
    assert accepts(schema_to_grammar(MAP), json.dumps(value, separators=(",", ":"))) == valid


@pytest.mark.parametrize(
    ("schema", "says"),
    [
        ({"type": "string", "pattern": "a+"}, "'pattern' (at /)"),
        ({"type": "string", "format": "email"}, "'format'"),
        ({"properties": {"x": {"type": "number", "minimum": 0.5}}}, "/properties/x/minimum"),
        ({"$ref": "https://example.invalid/s.json"}, "only '#/$defs/NAME'"),
        ({"$ref": "#/$defs/Missing"}, "is not defined"),
        ({"type": "object", "required": ["x"]}, "'x' has no schema"),
        ({"allOf": [{"type": "string"}, {"maxLength": 2}]}, "one schema only"),
        ({"type": "thing"}, "unknown type"),
        ({"type": "object", "properties": {"a": {}}, "additionalProperties": {"type": "string"}},
         "a schema without 'properties'"),
    ],
)  # fmt: skip
def test_unsupported_features_are_named(schema: Any, says: str) -> None:
    with pytest.raises(SchemaError) as caught:
        schema_to_grammar(schema)
    assert says in str(caught.value)
