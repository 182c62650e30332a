"""Anthropic's Messages API end to end through the frontend, against the stand-in engine:
replies and event streams in Anthropic's shapes, tool use both ways, stop reasons, usage
with the prefix cache, token counts, errors in Anthropic's shape naming the field."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from tests.frontend.harness import N_CTX, FakeEngine, Tick, accepted
from tinyserve import protocol
from tinyserve.frontend.request.state import TOKENIZER

Client = TestClient[Any, Any]
USER = [{"role": "user", "content": "What is the weather in Paris?"}]
BODY = {"model": "fake", "max_tokens": 16, "messages": USER}
WEATHER = {
    "name": "get_weather",
    "description": "Current weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                     "required": ["city"]},
}  # fmt: skip
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def replying(
    *pieces: str,
    reason: str = protocol.FINISH_STOP,
    cached: int = 0,
    ids: list[int] | None = None,
    stop: str = "",
) -> Callable[[protocol.Submit], list[Tick]]:
    """A script: accepted, then each piece as one token (ids 1, 2, ... unless given), then
    the finish (``stop``: the stop string the engine matched)."""
    token_ids = ids or list(range(1, len(pieces) + 1))

    def script(submit: protocol.Submit) -> list[Tick]:
        ticks: list[Tick] = [[accepted()]]
        for token, text in zip(token_ids, pieces, strict=True):
            ticks.append([{"token_ids": [token], "text": text.encode()}])
        end = {"finish_reason": reason, "prompt_tokens": len(submit.prompt_ids),
               "cached_tokens": cached, "stop_string": stop}  # fmt: skip
        ticks[-1][-1].update(end)
        return ticks

    return script


async def events(response: Any) -> list[tuple[str, dict[str, Any]]]:
    """(name, data) of every event of an SSE body; each is named by its data's type."""
    assert response.status == 200, await response.text()
    body = (await response.read()).decode()
    parsed = []
    for raw in body.split("\n\n")[:-1]:
        name_line, data_line = raw.split("\n")
        name = name_line.removeprefix("event: ")
        data = json.loads(data_line.removeprefix("data: "))
        assert data["type"] == name
        parsed.append((name, data))
    return parsed


async def anthropic_error(response: Any, status: int) -> dict[str, Any]:
    assert response.status == status, await response.text()
    body = await response.json()
    assert body["type"] == "error" and set(body["error"]) == {"type", "message", "code"}
    return dict(body["error"])


async def test_a_message_in_anthropics_shape(served: Client, engine: FakeEngine) -> None:
    engine.script = replying("Sunny", " and mild.", cached=3)
    response = await served.post("/v1/messages", json=BODY)
    assert response.status == 200, await response.text()
    reply = await response.json()
    [submit] = engine.submits
    assert reply == {
        "id": "msg_" + submit.request_id,
        "type": "message",
        "role": "assistant",
        "model": "fake",
        "content": [{"type": "text", "text": "Sunny and mild."}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": len(submit.prompt_ids) - 3, "output_tokens": 2,
                  "cache_creation_input_tokens": 0, "cache_read_input_tokens": 3},
    }  # fmt: skip
    assert response.headers["X-Request-Id"] == submit.request_id
    # The chat template rendered the conversation; sampling defaults as on the chat surface.
    assert "What is the weather in Paris?" in (await detokenized(served, submit))
    assert submit.max_tokens == 16 and submit.sampling.top_k == 40


async def detokenized(served: Client, submit: protocol.Submit) -> str:
    text: str = await served.app[TOKENIZER].detokenize(submit.prompt_ids)
    return text


async def test_a_stream_in_anthropics_event_order(served: Client, engine: FakeEngine) -> None:
    engine.script = replying("Sunny", " and mild.", reason=protocol.FINISH_LENGTH, cached=2)
    stream = await events(await served.post("/v1/messages", json={**BODY, "stream": True}))
    names = [name for name, _ in stream]
    assert names == ["message_start", "content_block_start", "content_block_delta",
                     "content_block_delta", "content_block_stop", "message_delta",
                     "message_stop"]  # fmt: skip
    [submit] = engine.submits
    start = stream[0][1]["message"]
    assert (start["content"], start["stop_reason"], start["usage"]["output_tokens"]) == (
        [],
        None,
        0,
    )
    assert start["usage"]["input_tokens"] == len(submit.prompt_ids)
    assert stream[1][1] == {"type": "content_block_start", "index": 0,
                            "content_block": {"type": "text", "text": ""}}  # fmt: skip
    texts = [data["delta"]["text"] for name, data in stream if name == "content_block_delta"]
    assert texts == ["Sunny", " and mild."]
    delta = stream[-2][1]
    assert delta["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}
    usage = delta["usage"]
    assert (usage["output_tokens"], usage["cache_read_input_tokens"]) == (2, 2)
    assert usage["input_tokens"] == len(submit.prompt_ids) - 2


async def test_tool_use_and_its_result(served: Client, engine: FakeEngine) -> None:
    engine.script = replying(CALL[:20], CALL[20:])
    body = {**BODY, "tools": [WEATHER], "tool_choice": {"type": "any"}}
    reply = await (await served.post("/v1/messages", json=body)).json()
    [use] = reply["content"]
    assert (use["type"], use["name"], use["input"]) == (
        "tool_use",
        "get_weather",
        {"city": "Paris"},
    )
    assert reply["stop_reason"] == "tool_use"
    # "any" is chat's "required": the grammar admits only calls, and the prompt offers the tool.
    first = engine.submits[0]
    assert first.sampling.grammar.startswith("root ::= call")
    assert "get_weather" in await detokenized(served, first)
    # The next turn carries the tool use and its result back.
    result = {"type": "tool_result", "tool_use_id": use["id"], "content": "18 C, sunny"}
    turns = [*USER, {"role": "assistant", "content": reply["content"]},
             {"role": "user", "content": [result]}]  # fmt: skip
    engine.script = replying("It is 18 C.")
    follow = {**BODY, "tools": [WEATHER], "messages": turns}
    answer = await (await served.post("/v1/messages", json=follow)).json()
    assert answer["content"] == [{"type": "text", "text": "It is 18 C."}]
    prompt = await detokenized(served, engine.submits[1])
    assert '"city": "Paris"' in prompt and "<tool_response>\n18 C, sunny" in prompt


async def test_a_streamed_tool_use_comes_whole(served: Client, engine: FakeEngine) -> None:
    engine.script = replying(CALL[:20], CALL[20:])
    body = {**BODY, "tools": [WEATHER], "stream": True}
    stream = await events(await served.post("/v1/messages", json=body))
    names = [name for name, _ in stream]
    assert names == ["message_start", "content_block_start", "content_block_delta",
                     "content_block_stop", "message_delta", "message_stop"]  # fmt: skip
    block = stream[1][1]["content_block"]
    assert (block["type"], block["name"], block["input"]) == ("tool_use", "get_weather", {})
    assert json.loads(stream[2][1]["delta"]["partial_json"]) == {"city": "Paris"}
    assert stream[-2][1]["delta"]["stop_reason"] == "tool_use"


async def test_a_stop_sequence_is_named(served: Client, engine: FakeEngine) -> None:
    ids = await served.app[TOKENIZER].tokenize("Sunny. Anything else")
    stopped = {**BODY, "stop_sequences": ["else", " Anything"]}
    engine.script = replying(*(await pieces(served, ids)), ids=ids, stop=" Anything")
    reply = await (await served.post("/v1/messages", json=stopped)).json()
    assert (reply["stop_reason"], reply["stop_sequence"]) == ("stop_sequence", " Anything")
    engine.script = replying(*(await pieces(served, ids)), ids=ids)
    reply = await (await served.post("/v1/messages", json=BODY)).json()
    assert (reply["stop_reason"], reply["stop_sequence"]) == ("end_turn", None)
    assert engine.submits[0].sampling.stop == ["else", " Anything"]


async def pieces(served: Client, ids: list[int]) -> list[str]:
    """The text of each token but that the engine shows none from the stop string on."""
    texts = [p.decode() for p in await served.app[TOKENIZER].token_pieces(ids)]
    cut = "".join(texts).index(" Anything")
    shown, out = 0, []
    for text in texts:
        out.append(text[: max(0, cut - shown)])
        shown += len(text)
    return out


async def test_count_tokens_is_the_prompt_a_request_is_charged(
    served: Client, engine: FakeEngine
) -> None:
    conversation = {"model": "fake", "messages": USER, "system": "Be brief.", "tools": [WEATHER]}
    counted = await served.post("/v1/messages/count_tokens", json=conversation)
    assert counted.status == 200, await counted.text()
    engine.script = replying("Sunny")
    reply = await (await served.post("/v1/messages", json={**conversation, "max_tokens": 8})).json()
    usage = reply["usage"]
    charged = usage["input_tokens"] + usage["cache_read_input_tokens"]
    assert await counted.json() == {"input_tokens": charged}
    assert charged == len(engine.submits[0].prompt_ids)


BAD = [
    ({**BODY, "max_tokens": None}, "'max_tokens' is required"),
    ({**BODY, "max_tokens": 0}, "'max_tokens' must be an integer of at least 1"),
    ({**BODY, "temperature": 1.5}, "'temperature' must be a number between 0 and 1"),
    ({**BODY, "messages": []}, "'messages' must have at least 1 item"),
    ({**BODY, "messages": [{"role": "user", "content": [{"text": "no type"}]}]},
     "'messages[0].content[0]' must be a content block with a 'type'"),
    ({**BODY, "messages": [{"role": "assistant", "content": [
        {"type": "tool_result", "tool_use_id": "t"}]}]},
     "'messages[0].content' of the assistant's turn cannot hold a tool_result block"),
    ({**BODY, "tools": [WEATHER], "tool_choice": {"type": "tool", "name": "nope"}},
     "no tool is named 'nope'"),
    ({**BODY, "messages": [*USER, {"role": "assistant", "content": [
        {"type": "tool_use", "id": "t", "name": "get_weather", "input": {"city": "\ud800"}}]}]},
     "'messages[1].content[0].input' is not valid Unicode"),
    ({**BODY, "tool_choice": {"type": "sometimes"}}, "'tool_choice' must have 'type' auto"),
    ({**BODY, "thinking": {"type": "sometimes"}}, "'thinking.type' must be"),
    ({**BODY, "tools": [{**WEATHER, "input_schema": {"type": "object",
                                                     "properties": {"city": "string"}}}]},
     "'tools' function 'get_weather' parameters: a schema must be an object"),
]  # fmt: skip


@pytest.mark.parametrize(("body", "message"), BAD)
async def test_bad_input_is_a_400_in_anthropics_shape(
    served: Client, engine: FakeEngine, body: dict[str, Any], message: str
) -> None:
    error = await anthropic_error(await served.post("/v1/messages", json=body), 400)
    assert error["type"] == "invalid_request_error"
    assert error["message"].startswith(message), error
    assert not engine.submits


async def test_other_errors_in_anthropics_shape(served: Client, engine: FakeEngine) -> None:
    long = {**BODY, "messages": [{"role": "user", "content": "word " * 600}]}
    too_long = await anthropic_error(await served.post("/v1/messages", json=long), 400)
    assert too_long["type"] == "invalid_request_error"
    assert too_long["message"].startswith("prompt is too long: ")  # Claude Code compacts
    engine.script = lambda submit: [[{"finish_reason": protocol.FINISH_REJECTED,
                                      "detail": protocol.REJECT_QUEUE_FULL}]]  # fmt: skip
    full = await served.post("/v1/messages", json=BODY)
    overloaded = await anthropic_error(full, 503)
    assert (overloaded["type"], overloaded["code"]) == ("overloaded_error", "queue_full")
    assert full.headers["Retry-After"]
    failure = {"finish_reason": protocol.FINISH_ERROR, "detail": "decode failed"}
    engine.script = lambda submit: [[accepted()], [{"token_ids": [1], "text": b"Hi"}], [failure]]
    stream = await events(await served.post("/v1/messages", json={**BODY, "stream": True}))
    assert [name for name, _ in stream][-2:] == ["content_block_delta", "error"]
    assert stream[-1][1]["error"] == {"type": "api_error", "message": "decode failed",
                                      "code": "engine_error"}  # fmt: skip
    not_json = await served.post("/v1/messages", data="x", headers={"Content-Type": "text/plain"})
    assert (await anthropic_error(not_json, 415))["type"] == "invalid_request_error"


# A request shaped as Claude Code 2.1.197 sends one (tests/agents: captured from it), cut down.
CLAUDE_CODE = {
    "model": "claude-opus-4-8",
    "max_tokens": 32000,
    "stream": True,
    "system": [
        {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.197.c23; "
                                 "cc_entrypoint=sdk-cli; cch=0af31;"},
        {"type": "text", "text": "You are a Claude agent.",
         "cache_control": {"type": "ephemeral"}},
    ],
    "messages": [
        {"role": "user", "content": [{"type": "text", "text": "Read hello.py"}]},
        {"role": "system", "content": "Available agent types: none."},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "The user wants a file.", "signature": "c2ln"},
            {"type": "tool_use", "id": "toolu_1", "name": "Read",
             "input": {"file_path": "/r/hello.py"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": [
                {"type": "text", "text": "print('hi')"},
                {"type": "image", "source": {"type": "base64", "data": "AAAA"}},
                {"type": "tool_reference", "tool_name": "Grep"}]}]},
    ],
    "tools": [
        {"name": "Read", "description": "Reads a file", "input_schema": {
            "$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object",
            "properties": {"file_path": {"type": "string", "format": "uri"},
                           "limit": {"type": "integer", "exclusiveMinimum": 0,
                                     "maximum": 9007199254740991}},
            "required": ["file_path"], "additionalProperties": False}},
        {"name": "Grep", "description": "Searches", "defer_loading": True,
         "input_schema": {"type": "object", "properties": {"pattern": {"type": "string"}},
                          "propertyNames": {"pattern": "^[a-z]+$"}}},
        {"type": "web_search_20250305", "name": "web_search", "max_uses": 5},
    ],
    "metadata": {"user_id": '{"device_id":"d","session_id":"s"}'},
    "thinking": {"type": "adaptive"},
    "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
    "output_config": {"effort": "high"},
    "inference_geo": "us",
    "temperature": 1,
}  # fmt: skip


async def test_what_claude_code_sends_is_served_and_what_is_ignored_is_said(
    served: Client, engine: FakeEngine
) -> None:
    engine.script = replying("It prints hi.")
    response = await served.post("/v1/messages?beta=true", json=CLAUDE_CODE)
    stream = await events(response)
    assert stream[-1][0] == "message_stop"
    [submit] = engine.submits
    fitted = min(256, N_CTX - len(submit.prompt_ids))  # --max-tokens-limit, the context left
    assert submit.max_tokens == fitted
    assert response.headers["X-TinyServe-Ignored"] == (
        "messages[].content[].content[](image), messages[].content[].content[](tool_reference), "
        "tools[].defer_loading, tools[](web_search_20250305), output_config.effort, "
        "context_management, inference_geo, tools schema keywords (format, propertyNames), "
        f"max_tokens (clamped to {fitted})"
    )
    prompt = await served.app[TOKENIZER].detokenize(submit.prompt_ids)
    assert "billing-header" not in prompt and "The user wants a file." not in prompt
    # The system message from the middle of the conversation stays there (the template
    # renders it): what comes before it is the prompt every turn starts with.
    assert prompt.index("You are a Claude agent.") < prompt.index("Read hello.py")
    assert prompt.index("Read hello.py") < prompt.index("Available agent types")
    assert "print('hi')" in prompt and "web_search" not in prompt
    assert stream[0][1]["message"]["model"] == "fake"  # the model that served it


async def test_any_model_id_is_served_unless_aliases_close_the_list(
    served: Client, engine: FakeEngine
) -> None:
    engine.script = replying("Hi")
    reply = await served.post("/v1/messages", json={**BODY, "model": "claude-haiku-4-5"})
    assert (await reply.json())["model"] == "fake"


CALL_PIECES = ['<tool_call>\n{"name": "get_weather", "arguments": {"ci', 'ty": "Pa', 'ris"}}',
               "\n</tool_call>"]  # fmt: skip


async def test_a_tool_uses_input_streams_as_it_is_written(
    served: Client, engine: FakeEngine
) -> None:
    engine.script = replying(*CALL_PIECES)
    body = {**BODY, "tools": [WEATHER], "stream": True}
    stream = await events(await served.post("/v1/messages", json=body))
    names = [name for name, _ in stream]
    start = names.index("content_block_start")
    assert stream[start][1]["content_block"]["name"] == "get_weather"
    pieces = [d["delta"]["partial_json"] for n, d in stream if n == "content_block_delta"]
    # The input came in pieces as the model wrote them, before the reply ended.
    assert len(pieces) >= 2 and names.index("content_block_stop") > start
    assert json.loads("".join(pieces)) == {"city": "Paris"}
    assert stream[-2][1]["delta"]["stop_reason"] == "tool_use"


@pytest.mark.parametrize(
    "reason", [protocol.FINISH_TIMEOUT, protocol.FINISH_DEADLINE_MISSED, protocol.FINISH_CANCELLED]
)
async def test_a_reply_cut_short_by_time_is_a_paused_turn_not_max_tokens(
    served: Client, engine: FakeEngine, reason: str
) -> None:
    engine.script = replying("Sun", "ny", reason=reason)
    reply = await (await served.post("/v1/messages", json=BODY)).json()
    assert (reply["stop_reason"], reply["content"][0]["text"]) == ("pause_turn", "Sunny")
    engine.script = replying("Sun", "ny", reason=reason)
    stream = await events(await served.post("/v1/messages", json={**BODY, "stream": True}))
    assert stream[-2][1]["delta"]["stop_reason"] == "pause_turn"
