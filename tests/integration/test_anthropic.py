"""Anthropic's Messages API of a real node, driven by the official ``anthropic`` client:
messages, streams, a two-step tool use, token counts equal to what a request is charged,
the prefix cache in the usage, errors in Anthropic's shape, and a long prefill kept alive
with ping events before the first token.

Any warning fails a test: the client must parse every reply and event cleanly.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import aiohttp
import anthropic
import jsonschema
import pytest
import requests

from .node import Node

pytestmark = [pytest.mark.integration, pytest.mark.filterwarnings("error")]

API_KEY = "sk-tinyserve-test"
PING_S = 0.1  # --sse-ping-interval: a prefill of seconds gets many pings
WEATHER_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20}, "unit": {"enum": ["C", "F"]}},
    "required": ["city", "unit"],
}
WEATHER: Any = {"name": "get_weather", "description": "Current weather in a city",
                "input_schema": WEATHER_SCHEMA}  # fmt: skip
ASK: Any = [{"role": "user", "content": "What is the weather in Paris?"}]
# This client version no longer sends temperature or top_k; the server still takes them.
GREEDY = {"temperature": 0}


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    workdir = tmp_path_factory.mktemp("anthropic")
    (workdir / "keys").write_text(f"{API_KEY}\n")
    flags = ("--slots", "4", "--ctx-per-slot", "4096", "--api-key-file", str(workdir / "keys"))
    running = Node(workdir, *flags, "--sse-ping-interval", str(PING_S)).start()
    yield running
    assert running.stop() == 0


@pytest.fixture(scope="module")
def client(node: Node) -> Iterator[anthropic.Anthropic]:
    # The client sends its key as x-api-key, and POSTs to {base_url}/v1/messages.
    with anthropic.Anthropic(base_url=node.url, api_key=API_KEY, max_retries=0) as sync:
        yield sync


@pytest.fixture(scope="module")
def model(node: Node) -> str:
    headers = {"x-api-key": API_KEY}
    return str(
        requests.get(f"{node.url}/v1/models", headers=headers, timeout=10).json()["data"][0]["id"]
    )


def test_a_message(client: anthropic.Anthropic, model: str) -> None:
    message = client.messages.create(model=model, max_tokens=16, messages=ASK, extra_body=GREEDY)
    message.model_dump()
    assert (message.type, message.role, message.model) == ("message", "assistant", model)
    [block] = message.content
    assert block.type == "text" and block.text
    assert message.stop_reason in ("end_turn", "max_tokens")
    assert message.usage.input_tokens > 0 and 0 < message.usage.output_tokens <= 16


def test_a_stream(client: anthropic.Anthropic, model: str) -> None:
    with client.messages.stream(
        model=model, max_tokens=16, messages=ASK, extra_body=GREEDY
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert (
        kinds.index("content_block_start") < kinds.index("text") < kinds.index("content_block_stop")
    )
    assert kinds.index("content_block_stop") < kinds.index("message_delta")
    [block] = final.content
    assert block.type == "text" and block.text
    assert final.stop_reason in ("end_turn", "max_tokens") and final.usage.output_tokens > 0


def test_the_stop_sequence_that_ended_a_reply_is_named(
    client: anthropic.Anthropic, model: str
) -> None:
    body: dict[str, Any] = {"model": model, "max_tokens": 24, "messages": ASK,
                            "extra_body": GREEDY}  # fmt: skip
    [free] = client.messages.create(**body).content
    assert free.type == "text"
    word = " " + free.text.split()[2]  # the engine matches it in the token stream
    stopped = client.messages.create(**body, stop_sequences=["never said", word])
    assert (stopped.stop_reason, stopped.stop_sequence) == ("stop_sequence", word)
    [block] = stopped.content
    assert block.type == "text" and block.text == free.text[: free.text.index(word)]


def test_a_two_step_tool_use(client: anthropic.Anthropic, model: str) -> None:
    first = client.messages.create(
        model=model, max_tokens=100, messages=ASK, tools=[WEATHER],
        tool_choice={"type": "any", "disable_parallel_tool_use": True}, extra_body=GREEDY,
    )  # fmt: skip
    assert first.stop_reason == "tool_use", first
    [use] = first.content
    assert use.type == "tool_use" and use.name == "get_weather"
    jsonschema.validate(use.input, WEATHER_SCHEMA)
    result = {"type": "tool_result", "tool_use_id": use.id, "content": "18 C, sunny"}
    turns = [*ASK, {"role": "assistant", "content": first.content},
             {"role": "user", "content": [result]}]  # fmt: skip
    answer = client.messages.create(
        model=model, max_tokens=30, messages=turns, tools=[WEATHER],
        tool_choice={"type": "none"}, extra_body=GREEDY,
    )  # fmt: skip
    assert answer.stop_reason in ("end_turn", "max_tokens")
    assert [block.type for block in answer.content] == ["text"]


def test_a_streamed_tool_use_comes_whole(client: anthropic.Anthropic, model: str) -> None:
    with client.messages.stream(
        model=model, max_tokens=100, messages=ASK, tools=[WEATHER],
        tool_choice={"type": "tool", "name": "get_weather"}, extra_body=GREEDY,
    ) as stream:  # fmt: skip
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use"
    uses = [block for block in final.content if block.type == "tool_use"]
    assert uses and all(use.name == "get_weather" for use in uses)
    for use in uses:
        jsonschema.validate(use.input, WEATHER_SCHEMA)


def test_count_tokens_is_what_the_request_is_charged(
    client: anthropic.Anthropic, model: str
) -> None:
    system = "You answer questions about the weather, briefly."
    counted = client.messages.count_tokens(model=model, messages=ASK, system=system,
                                           tools=[WEATHER])  # fmt: skip
    message = client.messages.create(model=model, max_tokens=4, messages=ASK, system=system,
                                     tools=[WEATHER], extra_body=GREEDY)  # fmt: skip
    usage = message.usage
    charged = usage.input_tokens + (usage.cache_read_input_tokens or 0)
    assert counted.input_tokens == charged > 0


def test_a_repeated_prompt_is_read_from_the_cache(client: anthropic.Anthropic, model: str) -> None:
    long_ask = [{"role": "user", "content": "Name three rivers of Europe. " * 20}]
    first = client.messages.create(model=model, max_tokens=2, messages=long_ask, extra_body=GREEDY)
    again = client.messages.create(model=model, max_tokens=2, messages=long_ask, extra_body=GREEDY)
    total = first.usage.input_tokens + (first.usage.cache_read_input_tokens or 0)
    assert (again.usage.cache_read_input_tokens or 0) > 0
    assert again.usage.input_tokens + (again.usage.cache_read_input_tokens or 0) == total


def test_bad_input_is_an_error_in_anthropics_shape(client: anthropic.Anthropic, model: str) -> None:
    with pytest.raises(anthropic.BadRequestError) as bad:
        client.messages.create(model=model, max_tokens=16, messages=ASK, extra_body={"top_k": -1})
    body: Any = bad.value.body
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert body["error"]["message"].startswith("'top_k' must be"), body
    with pytest.raises(anthropic.BadRequestError, match=re.escape("messages[0].content[0]")):
        client.messages.create(
            model=model, max_tokens=16, messages=[{"role": "user", "content": [{"text": "x"}]}],
        )  # fmt: skip
    long = [{"role": "user", "content": "word " * 5000}]
    with pytest.raises(anthropic.BadRequestError, match="prompt is too long: "):
        client.messages.create(model=model, max_tokens=16, messages=long)


def test_an_image_and_an_unknown_model_are_served_and_said_so(
    client: anthropic.Anthropic, model: str
) -> None:
    image = {"type": "image", "source": {"type": "url", "url": "http://127.0.0.1/x.png"}}
    ask = [{"role": "user", "content": [image, {"type": "text", "text": "Hi"}]}]
    raw = client.messages.with_raw_response.create(
        model="claude-x", max_tokens=4, messages=ask, extra_body=GREEDY
    )
    assert raw.headers["X-TinyServe-Ignored"] == "messages[].content[](image)"
    assert raw.parse().model == model


def test_a_wrong_key_is_refused(node: Node, model: str) -> None:
    with (
        anthropic.Anthropic(base_url=node.url, api_key="wrong", max_retries=0) as other,
        pytest.raises(anthropic.AuthenticationError),
    ):
        other.messages.create(model=model, max_tokens=4, messages=ASK)


async def test_a_long_prefill_is_kept_alive_with_pings(node: Node, model: str) -> None:
    # ~700 prompt tokens: seconds of prefill on one thread, many times --sse-ping-interval.
    words = " ".join(f"item{i}" for i in range(200))
    body = {"model": model, "max_tokens": 2, "stream": True,
            "messages": [{"role": "user", "content": f"Count these: {words}"}]}  # fmt: skip
    headers = {"x-api-key": API_KEY}
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{node.url}/v1/messages", json=body, headers=headers) as resp,
    ):
        assert resp.status == 200
        kinds = [
            json.loads(e.split("data: ", 1)[1])["type"]
            for e in (await resp.text()).split("\n\n")
            if e
        ]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    first_content = kinds.index("content_block_start")
    assert "ping" in kinds[1:first_content], kinds


def _claude_code_turn(billing: str, turns: list[Any]) -> dict[str, Any]:
    """A request shaped as Claude Code's: its billing block first in the system prompt
    (``cch`` new on every request), a system message after the first user turn, thinking,
    context management and effort (which this server ignores), ``turns`` after those."""
    system_text = "You are an agent for software tasks. " * 80  # most of a prompt
    return {
        "system": [
            {"type": "text", "text": f"x-anthropic-billing-header: cc_version=2.1.197.c23; "
                                     f"cc_entrypoint=sdk-cli; cch={billing};"},
            {"type": "text", "text": system_text, "cache_control": {"type": "ephemeral"}},
        ],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Read hello.py"}]},
            {"role": "system", "content": "Available agent types: general. " * 20},
            *turns,
        ],
        "tools": [{"name": "Read", "description": "Reads a file from the local filesystem.",
                   "input_schema": {"type": "object", "required": ["file_path"],
                                    "properties": {"file_path": {"type": "string"},
                                                   "offset": {"type": "integer", "minimum": 0}},
                                    "additionalProperties": False}}],
        "extra_body": {
            "thinking": {"type": "adaptive"}, "output_config": {"effort": "high"},
            "context_management": {"edits": [{"type": "clear_thinking_20251015"}]}, **GREEDY,
        },
    }  # fmt: skip


def test_a_claude_code_sessions_second_turn_reads_its_prompt_from_the_cache(
    client: anthropic.Anthropic, model: str
) -> None:
    first = client.messages.create(model=model, max_tokens=8, **_claude_code_turn("0af31", []))
    call = {"type": "tool_use", "id": "toolu_1", "name": "Read",
            "input": {"file_path": "/repo/hello.py"}}  # fmt: skip
    result = {"type": "tool_result", "tool_use_id": "toolu_1",
              "content": "def greet(name):\n    return f'Hello, {name}!'\n"}  # fmt: skip
    turns = [{"role": "assistant", "content": [call]}, {"role": "user", "content": [result]}]
    second = client.messages.create(model=model, max_tokens=8, **_claude_code_turn("91c4e", turns))
    prompt = second.usage.input_tokens + second.usage.cache_read_input_tokens
    assert prompt > first.usage.input_tokens + first.usage.cache_read_input_tokens
    assert second.usage.cache_read_input_tokens >= 0.9 * prompt, second.usage
