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
    running = Node(workdir, "--slots", "4", "--ctx-per-slot", "2048", "--threads", "1").start()
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
            {"type": "object", "properties": {"a": "string"}}}}}, "response_format",
         "is not a schema"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema":
            {"$ref": "#/$defs/missing"}}}}, "response_format", "is not defined"),
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
    counts = dict(re.findall(r"tinyserve_constrained_requests_total\{(.*)\} (\S+)", metrics))
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


WEATHER_PARAMETERS = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20}, "unit": {"enum": ["C", "F"]}},
    "required": ["city", "unit"],
}
WEATHER_TOOL: Any = {
    "type": "function",
    "function": {"name": "get_weather", "description": "Current weather in a city",
                 "parameters": WEATHER_PARAMETERS},
}  # fmt: skip
WEATHER_ASK: Any = [{"role": "user", "content": "What is the weather in Paris?"}]


def test_required_tool_call_has_valid_arguments(client: openai.OpenAI, model: str) -> None:
    reply = client.chat.completions.create(
        model=model, messages=WEATHER_ASK, tools=[WEATHER_TOOL], tool_choice="required",
        max_tokens=100, temperature=0.7, seed=3,
    )  # fmt: skip
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert choice.message.content is None
    calls = choice.message.tool_calls or []
    assert calls and all(c.function.name == "get_weather" for c in calls)  # type: ignore[union-attr]
    for c in calls:
        jsonschema.validate(json.loads(c.function.arguments), WEATHER_PARAMETERS)  # type: ignore[union-attr]
    # The conversation goes on with the call and its result (role tool).
    follow = client.chat.completions.create(
        model=model,
        messages=[*WEATHER_ASK, choice.message.model_dump(exclude_none=True),
                  {"role": "tool", "tool_call_id": calls[0].id, "content": "18 C, sunny"}],
        tools=[WEATHER_TOOL], tool_choice="none", max_tokens=30,
    )  # fmt: skip
    assert follow.choices[0].finish_reason in ("stop", "length")
    assert follow.choices[0].message.content


def test_streamed_tool_call_reassembles(client: openai.OpenAI, model: str) -> None:
    stream = client.chat.completions.create(
        model=model, messages=WEATHER_ASK, tools=[WEATHER_TOOL],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        parallel_tool_calls=False, max_tokens=100, stream=True,
    )  # fmt: skip
    arguments: dict[int, str] = {}
    names: dict[int, str] = {}
    reasons = []
    for chunk in stream:
        for choice in chunk.choices:
            reasons.append(choice.finish_reason)
            for delta in choice.delta.tool_calls or []:
                names[delta.index] = names.get(delta.index, "") + (delta.function.name or "")  # type: ignore[union-attr]
                arguments[delta.index] = arguments.get(delta.index, "") + (
                    delta.function.arguments or ""  # type: ignore[union-attr]
                )
    assert reasons[-1] == "tool_calls"
    assert names == {0: "get_weather"}
    jsonschema.validate(json.loads(arguments[0]), WEATHER_PARAMETERS)


def test_auto_answers_or_calls(client: openai.OpenAI, model: str) -> None:
    reply = client.chat.completions.create(
        model=model, messages=WEATHER_ASK, tools=[WEATHER_TOOL], max_tokens=60
    )
    choice = reply.choices[0]
    if choice.finish_reason == "tool_calls":
        for c in choice.message.tool_calls or []:
            jsonschema.validate(json.loads(c.function.arguments), WEATHER_PARAMETERS)  # type: ignore[union-attr]
    else:
        assert choice.message.content and not choice.message.content.startswith("<")


def test_langchain_bind_tools(node: Node, model: str) -> None:
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def get_weather(city: str, unit: Literal["C", "F"]) -> str:
        """Current weather in a city."""
        return "sunny"

    chat = ChatOpenAI(
        model=model, base_url=f"{node.url}/v1", api_key="none", max_tokens=100, max_retries=0
    )
    message = chat.bind_tools([get_weather], tool_choice="required").invoke(
        "What is the weather in Paris?"
    )
    assert message.tool_calls, message  # type: ignore[attr-defined]
    call = message.tool_calls[0]  # type: ignore[attr-defined]
    assert call["name"] == "get_weather" and set(call["args"]) == {"city", "unit"}


def test_bad_tool_requests_are_400s(client: openai.OpenAI, model: str) -> None:
    for extra, param in (
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [WEATHER_TOOL],
          "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ):  # fmt: skip
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(
                model=model, messages=WEATHER_ASK, max_tokens=4, extra_body=extra
            )
        assert isinstance(caught.value.body, dict) and caught.value.body["param"] == param


def test_what_a_schema_cannot_enforce_is_served_and_said_so(
    client: openai.OpenAI, model: str
) -> None:
    schema = {"type": "object", "properties": {"url": {"type": "string", "format": "uri",
                                                       "pattern": "^https://"}},
              "required": ["url"], "additionalProperties": False}  # fmt: skip
    raw = client.chat.completions.with_raw_response.create(
        model=model, messages=ASK, max_tokens=40,  # type: ignore[arg-type]
        response_format={"type": "json_schema", "json_schema": {"name": "u", "schema": schema}},
    )  # fmt: skip
    assert raw.headers["X-TinyServe-Ignored"] == "response_format schema keywords (format, pattern)"
    choice = raw.parse().choices[0]
    text = choice.message.content or ""
    # The schema's shape holds (JSON's grammar lets whitespace stand around the colon: a
    # sampled reply once wrote '{"url" :"person.json" }'); its format and pattern need not.
    assert re.match(r'\{\s*"url"\s*:\s*"', text), text
    if choice.finish_reason == "stop":  # else cut by max_tokens, mid-object
        assert list(json.loads(text)) == ["url"], text


def test_json_object_is_an_object(client: openai.OpenAI, model: str) -> None:
    reply = client.chat.completions.create(
        model=model, messages=ASK, max_tokens=150, response_format={"type": "json_object"}
    )
    choice = reply.choices[0]
    text = choice.message.content or ""
    assert text.startswith("{"), text
    if choice.finish_reason == "stop":  # else cut by max_tokens, mid-object
        assert isinstance(json.loads(text), dict)
