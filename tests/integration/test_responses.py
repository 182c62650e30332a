"""OpenAI's Responses API of a real node, driven by the official ``openai`` client
(``responses.create``, ``responses.stream``, ``responses.parse``) and by the OpenAI Agents
SDK: a function tool round trip, ``text.format`` json_schema, the prefix cache in the usage,
statelessness, errors naming the field, and a long prefill kept alive before the first
token.

Any warning fails a test: the clients must parse every reply and event cleanly.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from typing import Any

import aiohttp
import jsonschema
import openai
import pydantic
import pytest

from .node import Node

pytestmark = [pytest.mark.integration, pytest.mark.filterwarnings("error")]

API_KEY = "sk-tinyserve-test"
WEATHER_PARAMETERS = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20}, "unit": {"enum": ["C", "F"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
WEATHER: Any = {
    "type": "function",
    "name": "get_weather",
    "strict": True,
    "description": "Current weather in a city",
    "parameters": WEATHER_PARAMETERS,
}
ASK = "What is the weather in Paris?"


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    workdir = tmp_path_factory.mktemp("responses")
    (workdir / "keys").write_text(f"{API_KEY}\n")
    flags = ("--slots", "4", "--ctx-per-slot", "4096", "--api-key-file", str(workdir / "keys"))
    running = Node(workdir, *flags, "--sse-ping-interval", "0.1").start()
    yield running
    assert running.stop() == 0


@pytest.fixture(scope="module")
def client(node: Node) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{node.url}/v1", api_key=API_KEY, max_retries=0) as sync:
        yield sync


@pytest.fixture(scope="module")
def model(client: openai.OpenAI) -> str:
    return client.models.list().data[0].id


def test_a_response(client: openai.OpenAI, model: str) -> None:
    response = client.responses.create(
        model=model, input=ASK, instructions="Answer briefly.", max_output_tokens=16,
        temperature=0,
    )  # fmt: skip
    response.model_dump()
    assert response.status in ("completed", "incomplete") and response.output_text
    assert response.model == model and response.max_output_tokens == 16
    usage = response.usage
    assert usage is not None and usage.input_tokens > 0 and 0 < usage.output_tokens <= 16
    assert usage.input_tokens_details.cached_tokens >= 0


def test_a_stream(client: openai.OpenAI, model: str) -> None:
    # The client's final response is a completed one: the reply must end before
    # max_output_tokens, as the stop extension (a sampling field of every surface) ends it.
    with client.responses.stream(
        model=model, input=ASK, max_output_tokens=40, temperature=0, extra_body={"stop": "."}
    ) as stream:
        kinds, deltas = [], []
        for event in stream:
            kinds.append(event.type)
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
        final = stream.get_final_response()
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    assert kinds.index("response.output_item.added") < kinds.index("response.output_text.delta")
    assert final.output_text == "".join(deltas) != ""


def test_a_function_tool_round_trip(client: openai.OpenAI, model: str) -> None:
    first = client.responses.create(
        model=model, input=ASK, tools=[WEATHER], tool_choice="required",
        parallel_tool_calls=False, max_output_tokens=100, temperature=0,
    )  # fmt: skip
    [call] = first.output
    assert call.type == "function_call" and call.name == "get_weather"
    jsonschema.validate(json.loads(call.arguments), WEATHER_PARAMETERS)
    # Stateless: the next request carries the conversation, the call and its output.
    output = {"type": "function_call_output", "call_id": call.call_id, "output": "18 C, sunny"}
    answer = client.responses.create(
        model=model, input=[{"role": "user", "content": ASK}, call, output],  # type: ignore[list-item]
        tools=[WEATHER], tool_choice="none", max_output_tokens=30, temperature=0,
    )  # fmt: skip
    assert [item.type for item in answer.output] == ["message"] and answer.output_text


def test_a_streamed_function_call(client: openai.OpenAI, model: str) -> None:
    with client.responses.stream(
        model=model, input=ASK, tools=[WEATHER], tool_choice={"type": "function",
        "name": "get_weather"}, max_output_tokens=100, temperature=0,
    ) as stream:  # fmt: skip
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert "response.function_call_arguments.delta" in kinds
    calls = [item for item in final.output if item.type == "function_call"]
    assert calls and all(c.name == "get_weather" for c in calls)
    for c in calls:
        jsonschema.validate(json.loads(c.arguments), WEATHER_PARAMETERS)


class City(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=30)
    country: str = pydantic.Field(max_length=30)


def test_text_format_json_schema(client: openai.OpenAI, model: str) -> None:
    schema = City.model_json_schema() | {"additionalProperties": False}
    response = client.responses.create(
        model=model, input="Name a city in France.", max_output_tokens=60, temperature=0,
        text={"format": {"type": "json_schema", "name": "city", "schema": schema, "strict": True}},
    )  # fmt: skip
    jsonschema.validate(json.loads(response.output_text), schema)
    parsed = client.responses.parse(
        model=model, input="Name a city in Italy.", text_format=City, max_output_tokens=60,
        temperature=0,
    )  # fmt: skip
    assert isinstance(parsed.output_parsed, City)


def test_bad_input_names_the_field(client: openai.OpenAI, model: str) -> None:
    with pytest.raises(openai.BadRequestError) as stateful:
        client.responses.create(model=model, input=ASK, previous_response_id="resp_1")
    body: Any = stateful.value.body
    assert (body["param"], body["code"]) == ("previous_response_id", "unsupported_parameter")
    with pytest.raises(openai.BadRequestError) as bad:
        client.responses.create(model=model, input=ASK, max_output_tokens=0)
    assert (bad.value.body or {})["param"] == "max_output_tokens"  # type: ignore[index]


def answer_after_the_tool() -> Any:
    """Run hooks under which an agent's turn after a tool's result may only answer: the
    default model, free to choose, calls the tool again and again (a model that answers once
    it has the result needs no such hook)."""
    import agents

    class AnswerAfterTheTool(agents.RunHooks[Any]):
        async def on_tool_end(self, context: Any, agent: Any, tool: Any, result: Any) -> None:
            agent.model_settings = dataclasses.replace(agent.model_settings, tool_choice="none")

    return AnswerAfterTheTool()


async def run_agent(node: Node, agent: Any) -> Any:
    """``agent``'s run on ``ASK`` through the node's Responses API, under
    ``answer_after_the_tool``, in the test's own loop with its client closed at the end
    (``Runner.run_sync``'s loop and a client left open were collected in a later test, whose
    unraisable-exception check then failed)."""
    import agents

    async with openai.AsyncOpenAI(
        base_url=f"{node.url}/v1", api_key=API_KEY, max_retries=0
    ) as client:
        provider = agents.OpenAIProvider(openai_client=client, use_responses=True)
        return await agents.Runner.run(
            agent, ASK, run_config=agents.RunConfig(model_provider=provider), max_turns=4,
            hooks=answer_after_the_tool(),
        )  # fmt: skip


async def test_an_agent_with_one_tool(node: Node, model: str) -> None:
    import agents

    agents.set_tracing_disabled(True)  # no network: traces would go to OpenAI
    asked: list[str] = []

    @agents.function_tool
    def get_weather(city: str) -> str:
        """Current weather in a city."""
        asked.append(city)
        return "18 C, sunny"

    settings = agents.ModelSettings(tool_choice="required", temperature=0, max_tokens=100)
    agent = agents.Agent(
        name="weather", instructions="Use the tool to answer.", model=model,
        tools=[get_weather], model_settings=settings, reset_tool_choice=False,
    )  # fmt: skip
    result = await run_agent(node, agent)
    assert asked and isinstance(result.final_output, str) and result.final_output
    kinds = [item.type for item in result.new_items]
    assert kinds.index("tool_call_item") < kinds.index("tool_call_output_item")
    assert kinds[-1] == "message_output_item"


async def test_an_agent_with_a_tool_and_an_output_type_runs_with_no_model_settings(
    node: Node, model: str
) -> None:
    import agents

    agents.set_tracing_disabled(True)

    class Forecast(pydantic.BaseModel):
        sunny: bool

    @agents.function_tool
    def get_weather(city: str) -> str:
        """Current weather in a city."""
        return "18 C, sunny"

    # No model settings: the first request carries the tool and the output type's schema
    # (text.format) together, with no output limit, as the SDK sends them.
    agent = agents.Agent(
        name="forecast", instructions="Say whether it is sunny.", model="gpt-4.1",
        tools=[get_weather], output_type=Forecast, reset_tool_choice=False,
    )  # fmt: skip
    result = await run_agent(node, agent)
    assert isinstance(result.final_output, Forecast)


async def test_a_long_prefill_is_kept_alive(node: Node, model: str) -> None:
    # ~700 prompt tokens: seconds of prefill on one thread, many times --sse-ping-interval.
    words = " ".join(f"entry{i}" for i in range(200))
    body = {"model": model, "input": f"Count these: {words}", "max_output_tokens": 2,
            "stream": True}  # fmt: skip
    headers = {"Authorization": f"Bearer {API_KEY}"}
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{node.url}/v1/responses", json=body, headers=headers) as resp,
    ):
        assert resp.status == 200
        events = [e for e in (await resp.text()).split("\n\n") if e]
    first_delta = next(i for i, e in enumerate(events) if "response.output_text.delta" in e)
    kept = [i for i, e in enumerate(events) if e == ": keep-alive"]
    assert kept and kept[0] < first_delta, events[:8]
