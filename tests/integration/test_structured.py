"""Structured output on a real node: JSON schemas and grammars enforced by the engine, checked
with real clients (the ``openai`` SDK's ``parse()``, langchain-openai) and ``jsonschema``."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from typing import Any, Literal

import aiohttp
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from .node import Node, generate

pytestmark = [pytest.mark.integration]

ASK = [{"role": "user", "content": "Describe a person as JSON."}]
NAME = {"type": "string", "minLength": 1, "maxLength": 12}
SCHEMAS: dict[str, dict[str, Any]] = {
    "nested": {
        "type": "object",
        "properties": {
            "person": {
                "type": "object",
                "properties": {"name": NAME, "age": {"type": "integer"}},
                "required": ["name", "age"],
                "additionalProperties": False,
            }
        },
        "required": ["person"],
    },
    "array_and_enum": {
        "type": "object",
        "properties": {
            "colors": {
                "type": "array",
                "items": {"enum": ["red", "green", "blue"]},
                "minItems": 1,
                "maxItems": 3,
            },
            "mood": {"type": "string", "enum": ["happy", "sad"]},
        },
        "required": ["colors", "mood"],
    },
    "bounded_numbers": {
        "type": "object",
        "properties": {
            "age": {"type": "integer", "minimum": 18, "maximum": 65},
            "score": {"type": "number", "minimum": -1, "maximum": 1},
            "level": {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 4},
        },
        "required": ["age", "score", "level"],
    },
    "optional_fields": {
        "$defs": {"Pet": {"type": "object", "properties": {"name": NAME}, "required": ["name"]}},
        "type": "object",
        "properties": {
            "name": NAME,
            "pet": {"anyOf": [{"$ref": "#/$defs/Pet"}, {"type": "null"}]},
            "alive": {"type": "boolean"},
        },
        "required": ["name"],
    },
}


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    workdir = tmp_path_factory.mktemp("structured")
    running = Node(workdir, "--slots", "4", "--ctx", "2048", "--threads", "1").start()
    yield running
    assert running.stop() == 0


@pytest.fixture(scope="module")
def client(node: Node) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{node.url}/v1", api_key="none", max_retries=0) as sync:
        yield sync


@pytest.fixture(scope="module")
def model(client: openai.OpenAI) -> str:
    return client.models.list().data[0].id


@pytest.mark.parametrize("name", list(SCHEMAS))
def test_json_schema_output_validates(client: openai.OpenAI, model: str, name: str) -> None:
    schema = SCHEMAS[name]
    for seed in range(3):
        reply = client.chat.completions.create(
            model=model,
            messages=ASK,  # type: ignore[arg-type]
            max_tokens=200,
            temperature=1.0,
            seed=seed,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": name, "schema": schema, "strict": True},
            },
        )
        choice = reply.choices[0]
        assert choice.finish_reason == "stop", choice.message.content
        jsonschema.validate(json.loads(choice.message.content or ""), schema)


def test_completions_take_response_format_too(client: openai.OpenAI, model: str) -> None:
    schema = SCHEMAS["bounded_numbers"]
    reply = client.completions.create(
        model=model,
        prompt="A record as JSON:",
        max_tokens=100,
        extra_body={"response_format": {"type": "json_schema",
                                        "json_schema": {"name": "r", "schema": schema}}},
    )  # fmt: skip
    jsonschema.validate(json.loads(reply.choices[0].text), schema)


class Pet(BaseModel):
    kind: Literal["cat", "dog", "fish"]
    name: str = Field(max_length=12)


class Person(BaseModel):
    name: str = Field(max_length=12)
    age: int = Field(ge=0, le=120)
    pets: list[Pet] = Field(max_length=2)


def test_openai_parse_returns_the_pydantic_object(client: openai.OpenAI, model: str) -> None:
    reply = client.chat.completions.parse(
        model=model,
        messages=ASK,  # type: ignore[arg-type]
        max_tokens=300,
        response_format=Person,
    )
    parsed = reply.choices[0].message.parsed
    assert isinstance(parsed, Person), reply.choices[0].message.content
    assert 0 <= parsed.age <= 120


def test_langchain_with_structured_output(node: Node, model: str) -> None:
    from langchain_openai import ChatOpenAI

    chat = ChatOpenAI(
        model=model, base_url=f"{node.url}/v1", api_key="none", max_tokens=300, max_retries=0
    )
    structured = chat.with_structured_output(Person, method="json_schema")
    person = structured.invoke("Describe a person.")
    assert isinstance(person, Person)


def test_streamed_json_reassembles(client: openai.OpenAI, model: str) -> None:
    schema = SCHEMAS["nested"]
    stream = client.chat.completions.create(
        model=model,
        messages=ASK,  # type: ignore[arg-type]
        max_tokens=200,
        stream=True,
        response_format={"type": "json_schema", "json_schema": {"name": "n", "schema": schema}},
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    jsonschema.validate(json.loads(text), schema)


@pytest.mark.parametrize(
    ("body", "param", "says"),
    [
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema":
            {"type": "string", "pattern": "a+"}}}}, "response_format", "'pattern'"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema":
            {"type": "number", "minimum": 0.5}}}}, "response_format", "whole-number"),
        ({"response_format": {"type": "xml"}}, "response_format", "json_schema"),
        ({"logit_bias": {"99999999": 1}}, "logit_bias", "not in the vocabulary"),
        ({"logit_bias": {"1": 101}}, "logit_bias", "between -100 and 100"),
    ],
)  # fmt: skip
def test_bad_constraints_are_400s_naming_the_field(
    client: openai.OpenAI, model: str, body: dict[str, Any], param: str, says: str
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model=model,
            messages=ASK,  # type: ignore[arg-type]
            max_tokens=4,
            extra_body=body,
        )
    error = caught.value.body
    assert isinstance(error, dict)
    assert error["param"] == param and says in error["message"], error


async def test_native_grammar_and_schema(node: Node) -> None:
    async with aiohttp.ClientSession() as session:
        status, body = await generate(
            session, node.url, prompt="Is water wet?", grammar='root ::= "yes" | "no"',
            max_tokens=8, timeline=True,
        )  # fmt: skip
        assert status == 200 and body["text"] in ("yes", "no"), body
        assert re.fullmatch("[0-9a-f]{16}", body["timeline"]["grammar"]["hash"])
        status, body = await generate(
            session, node.url, prompt="Age:", json_schema=SCHEMAS["bounded_numbers"],
            max_tokens=100,
        )  # fmt: skip
        assert status == 200, body
        jsonschema.validate(json.loads(body["text"]), SCHEMAS["bounded_numbers"])
        for bad, says in (("root ::= missing", "Undefined rule identifier 'missing'"),
                          ('other ::= "x"', 'root')):  # fmt: skip
            status, body = await generate(session, node.url, prompt="Hi", grammar=bad)
            message = body["error"]["message"]
            assert status == 400 and message.startswith("'grammar' does not compile"), body
            assert says in message, body
        status, body = await generate(
            session, node.url, prompt="Hi", grammar='root ::= "x"', ignore_eos=True
        )
        assert status == 400 and body["error"]["message"].startswith("'ignore_eos'"), body
        async with session.get(f"{node.url}/metrics") as resp:
            metrics = await resp.text()
    counts = dict(re.findall(r'tinyserve_constrained_requests_total\{(.*)\} (\S+)', metrics))
    # One frontend or the other took each request: the node's totals sum them.
    assert float(counts['result="invalid",source="grammar"']) == 3, counts
    assert float(counts['result="ok",source="grammar"']) >= 1, counts
    assert float(counts['result="ok",source="json_schema"']) >= 1, counts


async def test_constrained_and_free_requests_together(node: Node) -> None:
    async with aiohttp.ClientSession() as session:
        free_alone = await generate(session, node.url, prompt="The sea is", max_tokens=16)
        both = await asyncio.gather(
            generate(session, node.url, prompt="The sea is", max_tokens=16),
            generate(session, node.url, prompt="Pick:", max_tokens=8,
                     grammar='root ::= ("red" | "blue") "!"'),
        )  # fmt: skip
    assert both[0][0] == 200 and both[0][1]["text"] == free_alone[1]["text"]
    assert both[1][0] == 200 and both[1][1]["text"] in ("red!", "blue!")
