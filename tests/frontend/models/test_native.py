"""The /generate request contract: every rule of native.native_bodies, one case at a time."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tinyserve.config import build_config
from tinyserve.frontend.models.common import ignored_fields
from tinyserve.frontend.models.errors import ApiError
from tinyserve.frontend.models.parse import parse_body
from tinyserve.frontend.native.native_bodies import GenerateRequest
from tinyserve.frontend.native.native_handlers import generation_of
from tinyserve.frontend.request.generation import Generation
from tinyserve.protocol import SamplingParams

CONFIG = build_config({"max_tokens_limit": 512, "default_max_tokens": 32}, environ={})


def parse(body: Any) -> Generation:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return generation_of(parse_body(raw, GenerateRequest), CONFIG)


def rejected(body: Any) -> ApiError:
    with pytest.raises(ApiError) as info:
        parse(body)
    assert info.value.status == 400
    assert info.value.type == "invalid_request"
    return info.value


def test_defaults() -> None:
    req = parse({"prompt": "hi"})
    assert req == Generation(
        prompt="hi", max_tokens=32, sampling=SamplingParams(), max_tokens_asked=False
    )
    s = req.sampling
    assert (req.stream, s.temperature, s.top_p, s.top_k) == (False, 0.0, 1.0, 0)
    assert (s.seed, s.stop, req.priority, req.tenant, req.timeline) == (
        None,
        [],
        0,
        "default",
        False,
    )


def test_every_field() -> None:
    req = parse(
        {
            "prompt": "hi",
            "max_tokens": 512,
            "stream": True,
            "temperature": 2,
            "top_p": 0.5,
            "top_k": 40,
            "seed": 7,
            "stop": ["\n", "END"],
            "priority": -10,
            "tenant": "team-a.b_c",
            "timeline": True,
            "presence_penalty": 0.5,
            "frequency_penalty": -1,
        }
    )
    assert req.max_tokens == 512 and req.stream and req.timeline
    assert (req.sampling.presence_penalty, req.sampling.frequency_penalty) == (0.5, -1.0)
    sampling = req.sampling
    assert sampling.temperature == 2.0 and isinstance(sampling.temperature, float)
    assert (sampling.top_p, sampling.top_k, sampling.seed, req.priority) == (0.5, 40, 7, -10)
    assert sampling.stop == ["\n", "END"] and req.tenant == "team-a.b_c"


def test_stop_string_becomes_list() -> None:
    assert parse({"prompt": "x", "stop": "###"}).sampling.stop == ["###"]


def test_null_means_default() -> None:
    req = parse({"prompt": "x", "max_tokens": None, "stream": None, "seed": None})
    assert (req.max_tokens, req.stream, req.sampling.seed) == (32, False, None)


@pytest.mark.parametrize(
    "body",
    [b"", b"{", b"not json", b"\xff\xfe", b"[" * 100_000 + b"]" * 100_000],
    ids=["empty", "truncated", "text", "not-utf8", "deeply-nested"],
)
def test_malformed_json(body: bytes) -> None:
    assert "JSON" in rejected(body).message


@pytest.mark.parametrize("body", [[], "prompt", 3, None, True])
def test_body_not_an_object(body: Any) -> None:
    assert "object" in rejected(body).message


def test_an_unknown_field_is_ignored_and_reported() -> None:
    body = parse_body(json.dumps({"prompt": "x", "temprature": 1}).encode(), GenerateRequest)
    assert ignored_fields(body) == ["temprature"]


@pytest.mark.parametrize("prompt", [None, "", 5, ["a"], {"a": 1}, True])
def test_bad_prompt(prompt: Any) -> None:
    body = {"prompt": prompt} if prompt is not None else {}
    assert "'prompt'" in rejected(body).message


def test_lone_surrogate_prompt() -> None:
    assert "'prompt'" in rejected(b'{"prompt": "a\\ud800b"}').message


BAD_VALUES = [
    ("max_tokens", 0),
    ("max_tokens", -1),
    ("max_tokens", 1.5),
    ("max_tokens", True),
    ("max_tokens", "5"),
    ("stream", 1),
    ("stream", "true"),
    ("temperature", -0.1),
    ("temperature", 2.01),
    ("temperature", "1"),
    ("temperature", True),
    ("temperature", 10**400),
    ("top_p", 0),
    ("top_p", 1.5),
    ("top_p", -0.2),
    ("top_p", False),
    ("top_k", -1),
    ("top_k", 1.5),
    ("top_k", 2**70),  # once a 500: msgpack cannot pack it
    ("top_k", True),
    ("presence_penalty", 2.5),
    ("frequency_penalty", True),
    ("seed", -1),
    ("seed", 2**32),
    ("seed", 1.5),
    ("seed", "1"),
    ("seed", False),
    ("stop", 5),
    ("stop", [""]),
    ("stop", ["x" * 65]),
    ("stop", [f"s{i}" for i in range(17)]),
    ("stop", ["a", 1]),
    ("stop", {"a": 1}),
    ("priority", 11),
    ("priority", -11),
    ("priority", 1.5),
    ("priority", True),
    ("tenant", ""),
    ("tenant", "a" * 65),
    ("tenant", "has space"),
    ("tenant", "slash/y"),
    ("tenant", "ünïcode"),
    ("tenant", 5),
    ("timeline", "yes"),
    ("timeline", 0),
]


@pytest.mark.parametrize(("name", "value"), BAD_VALUES)
def test_bad_field_value(name: str, value: Any) -> None:
    assert repr(name) in rejected({"prompt": "x", name: value}).message


@pytest.mark.parametrize("literal", [b"NaN", b"Infinity", b"-Infinity"])
def test_non_finite_temperature(literal: bytes) -> None:
    # Python's json module accepts these literals; the API must not.
    rejected(b'{"prompt": "x", "temperature": ' + literal + b"}")


def test_stop_surrogate() -> None:
    assert "'stop'" in rejected(b'{"prompt": "x", "stop": ["\\udfff"]}').message


def test_duplicate_keys_are_refused() -> None:
    assert (
        "duplicate key 'max_tokens'"
        in rejected(b'{"prompt": "x", "max_tokens": 1, "max_tokens": 2}').message
    )
    assert "duplicate key 'a'" in rejected(b'{"prompt": "x", "stop": [{"a": 1, "a": 1}]}').message


def test_integral_floats_are_integers() -> None:
    # JSON (and JSON Schema) has one number type: 2.0 is the integer 2.
    req = parse({"prompt": "x", "max_tokens": 2.0, "top_k": 3.0, "seed": 0.0, "priority": -1.0})
    values = (req.max_tokens, req.sampling.top_k, req.sampling.seed, req.priority)
    assert values == (2, 3, 0, -1)
    assert all(type(v) is int for v in values)


def test_edge_values_accepted() -> None:
    req = parse({"prompt": "x", "max_tokens": 1, "top_p": 1, "seed": 2**32 - 1, "priority": 10})
    values = (req.max_tokens, req.sampling.top_p, req.sampling.seed, req.priority)
    assert values == (1, 1.0, 2**32 - 1, 10)
    assert parse({"prompt": "x", "stop": ["y" * 64] * 4}).sampling.stop == ["y" * 64] * 4
    assert parse({"prompt": "x", "stop": []}).sampling.stop == []
    assert parse({"prompt": "x", "tenant": "a" * 64}).tenant == "a" * 64
