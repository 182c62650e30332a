"""Each tool family's own format on a real node: the default model with that family's real
chat template (``tests/chat_templates.py``), the prompt it renders with tools, and replies in
the family's syntax (forced by grammars) read back into tool calls by the official ``openai``
client and langchain-openai; a Qwen 3 reply's thinking in ``reasoning_content``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import jsonschema
import openai
import pytest

from tests.chat_templates import LLAMA32, MISTRAL_NEMO, QWEN3, hf_render, model_with_template

from .node import Node

pytestmark = [pytest.mark.integration, pytest.mark.filterwarnings("error")]

PARAMETERS = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}},
    "required": ["city"],
}
WEATHER: Any = {
    "type": "function",
    "function": {"name": "get_weather", "description": "The weather in a city, now",
                 "parameters": PARAMETERS},
}  # fmt: skip
ASK: Any = [{"role": "user", "content": "What is the weather in Paris?"}]
CALL_ID = "a1b2c3d4e"  # 9 letters and digits: Mistral's template takes no other


@dataclass(frozen=True)
class Family:
    template: str
    written: str  # how a reply of ours in this syntax begins
    reply: str  # a call as the family's models write it (their model cards)


FAMILIES = {
    "qwen3": Family(
        QWEN3, "<tool_call>\n",
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    ),
    "llama3.2": Family(
        LLAMA32, '{"name": "get_weather", "parameters": ',
        '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}',
    ),
    "mistral-nemo": Family(
        MISTRAL_NEMO, '[TOOL_CALLS][{"name": "get_weather", "arguments": ',
        '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}]',
    ),
}  # fmt: skip


@dataclass(frozen=True)
class Served:
    name: str
    family: Family
    node: Node
    client: openai.OpenAI
    model: str


@pytest.fixture(scope="module", params=list(FAMILIES))
def served(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    name, family = request.param, FAMILIES[request.param]
    workdir = tmp_path_factory.mktemp(name)
    model = model_with_template(family.template, workdir, name)
    flags = ("--model", str(model), "--slots", "2", "--ctx-per-slot", "2048", "--threads", "1")
    node = Node(workdir, *flags, frontends=1).start()
    with openai.OpenAI(base_url=f"{node.url}/v1", api_key="none", max_retries=0) as client:
        yield Served(name, family, node, client, client.models.list().data[0].id)
    assert node.stop() == 0


def literal(text: str) -> str:
    """A grammar that admits ``text`` alone."""
    return f"root ::= {json.dumps(text)}"


def conversation_with_a_call() -> list[Any]:
    call = {"id": CALL_ID, "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}  # fmt: skip
    return [*ASK, {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": CALL_ID, "content": "18 C, sunny"}]  # fmt: skip


async def test_the_prompt_is_what_the_template_renders(served: Served) -> None:
    messages = conversation_with_a_call()
    async with aiohttp.ClientSession(served.node.url) as session:
        async with session.post("/tokenize", json={"messages": messages, "tools": [WEATHER]}) as r:
            ids = (await r.json())["tokens"]
        async with session.post("/detokenize", json={"tokens": ids}) as r:
            prompt = (await r.json())["prompt"]
        async with session.get("/tokenizer_info") as r:
            info = await r.json()
    for message in messages:  # as Hugging Face takes a conversation: arguments as objects
        for call in message.get("tool_calls") or []:
            call["function"]["arguments"] = json.loads(call["function"]["arguments"])
            message["content"] = ""
    expected = hf_render(
        served.family.template, messages=messages, tools=[WEATHER], add_generation_prompt=True,
        bos_token=info["bos_token"], eos_token=info["eos_token"],
    )  # fmt: skip
    assert prompt == expected
    # The chat request renders the same conversation into the same prompt.
    reply = served.client.chat.completions.create(
        model=served.model, messages=conversation_with_a_call(), tools=[WEATHER], max_tokens=1
    )
    assert reply.usage is not None and reply.usage.prompt_tokens == len(ids)


def test_a_required_call_is_written_in_the_familys_syntax(served: Served) -> None:
    reply = served.client.chat.completions.create(
        model=served.model, messages=ASK, tools=[WEATHER], tool_choice="required",
        max_tokens=60, logprobs=True, parallel_tool_calls=False,
    )  # fmt: skip
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert choice.logprobs is not None and choice.logprobs.content is not None
    written = "".join(token.token for token in choice.logprobs.content)
    assert written.startswith(served.family.written), written
    [call] = choice.message.tool_calls or []
    assert call.function.name == "get_weather"  # type: ignore[union-attr]
    jsonschema.validate(json.loads(call.function.arguments), PARAMETERS)  # type: ignore[union-attr]
    # The call and its result go back to the template (Mistral's checks the call's id).
    follow = served.client.chat.completions.create(
        model=served.model, tools=[WEATHER], max_tokens=8,
        messages=[*ASK, choice.message.model_dump(exclude_none=True),
                  {"role": "tool", "tool_call_id": call.id, "content": "18 C"}],
    )  # fmt: skip
    assert follow.choices[0].finish_reason in ("stop", "length", "tool_calls")


def test_a_call_as_the_familys_models_write_it(served: Served) -> None:
    grammar = {"grammar": literal(served.family.reply)}
    reply = served.client.chat.completions.create(
        model=served.model, messages=ASK, tools=[WEATHER], max_tokens=60, extra_body=grammar
    )
    [call] = reply.choices[0].message.tool_calls or []
    assert (call.function.name, call.function.arguments) == (  # type: ignore[union-attr]
        "get_weather", '{"city": "Paris"}'
    )  # fmt: skip
    assert (
        reply.choices[0].finish_reason == "tool_calls" and reply.choices[0].message.content is None
    )
    with served.client.chat.completions.stream(
        model=served.model, messages=ASK, tools=[WEATHER], max_tokens=60, extra_body=grammar
    ) as stream:
        final = stream.get_final_completion()
    [streamed] = final.choices[0].message.tool_calls or []
    assert streamed.function.arguments == '{"city": "Paris"}'
    assert final.choices[0].finish_reason == "tool_calls"


def test_langchain_bind_tools_reads_the_familys_calls(served: Served) -> None:
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def get_weather(city: str) -> str:
        """The weather in a city, now."""
        return "sunny"

    chat = ChatOpenAI(
        model=served.model, base_url=f"{served.node.url}/v1", api_key="none", max_tokens=60,
        max_retries=0, extra_body={"grammar": literal(served.family.reply)},
    )  # fmt: skip
    message = chat.bind_tools([get_weather]).invoke("What is the weather in Paris?")
    assert [(c["name"], c["args"]) for c in message.tool_calls] == [  # type: ignore[attr-defined]
        ("get_weather", {"city": "Paris"})
    ]


THINKING = "<think>\nParis is in France.\n</think>\n\nIt is sunny."


@pytest.mark.parametrize("served", ["qwen3"], indirect=True)  # the reasoning model's template
def test_thinking_goes_to_reasoning_content(served: Served) -> None:
    grammar = {"grammar": literal(THINKING)}
    reply = served.client.chat.completions.create(
        model=served.model, messages=ASK, max_tokens=60, extra_body=grammar
    )
    message = reply.choices[0].message
    assert (message.model_extra or {}).get("reasoning_content") == "Paris is in France."
    assert message.content == "It is sunny."
    stream = served.client.chat.completions.create(
        model=served.model, messages=ASK, max_tokens=60, extra_body=grammar, stream=True
    )
    thinking, text = [], []
    for chunk in stream:
        for choice in chunk.choices:
            thinking.append((choice.delta.model_extra or {}).get("reasoning_content") or "")
            text.append(choice.delta.content or "")
    assert ("".join(thinking), "".join(text)) == ("Paris is in France.", "It is sunny.")
    first_thought = next(i for i, delta in enumerate(thinking) if delta)
    first_word = next(i for i, delta in enumerate(text) if delta)
    assert first_thought < first_word
