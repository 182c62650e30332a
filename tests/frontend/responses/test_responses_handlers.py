"""OpenAI's Responses API end to end through the frontend, against the stand-in engine:
responses and their event streams, function calls both ways, text.format, usage with the
prefix cache, statelessness, errors in OpenAI's shape naming the field."""

from __future__ import annotations

import json
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from tests.frontend.anthropic.test_anthropic_handlers import CALL, detokenized, replying
from tests.frontend.harness import N_CTX, FakeEngine, accepted
from tests.frontend.openai.test_openai_handlers import openai_error
from tinyserve import protocol
from tinyserve.frontend.request.state import TOKENIZER

Client = TestClient[Any, Any]
BODY = {"model": "fake", "input": "What is the weather in Paris?"}
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]},
}  # fmt: skip


async def events(response: Any) -> list[dict[str, Any]]:
    """The data of every event of an SSE body, each named by its type and numbered in order."""
    assert response.status == 200, await response.text()
    parsed = []
    for raw in (await response.read()).decode().split("\n\n")[:-1]:
        name_line, data_line = raw.split("\n")
        data = json.loads(data_line.removeprefix("data: "))
        assert name_line == f"event: {data['type']}"
        parsed.append(data)
    assert [e["sequence_number"] for e in parsed] == list(range(len(parsed)))
    return parsed


async def test_a_response(served: Client, engine: FakeEngine) -> None:
    engine.script = replying("Sunny", " and mild.", cached=3)
    body = {**BODY, "instructions": "Be brief.", "max_output_tokens": 20, "temperature": 0.5}
    reply = await (await served.post("/v1/responses", json=body)).json()
    [submit] = engine.submits
    assert reply["id"] == "resp_" + submit.request_id and reply["object"] == "response"
    assert (reply["status"], reply["incomplete_details"], reply["error"]) == (
        "completed",
        None,
        None,
    )
    [item] = reply["output"]
    assert (item["type"], item["role"], item["status"]) == ("message", "assistant", "completed")
    assert item["content"] == [{"type": "output_text", "text": "Sunny and mild.",
                                "annotations": [], "logprobs": []}]  # fmt: skip
    prompt_tokens = len(submit.prompt_ids)
    assert reply["usage"] == {
        "input_tokens": prompt_tokens, "input_tokens_details": {"cached_tokens": 3,
                                                                "cache_write_tokens": 0},
        "output_tokens": 2, "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt_tokens + 2,
    }  # fmt: skip
    # What it ran with; instructions are the system message, before the input.
    assert (reply["max_output_tokens"], reply["temperature"], reply["top_p"]) == (20, 0.5, 0.95)
    assert (submit.max_tokens, submit.sampling.temperature) == (20, 0.5)
    prompt = await detokenized(served, submit)
    assert prompt.index("Be brief.") < prompt.index("What is the weather in Paris?")


async def test_a_stream_in_the_responses_event_order(served: Client, engine: FakeEngine) -> None:
    engine.script = replying("Sunny", " and mild.", reason=protocol.FINISH_LENGTH)
    stream = await events(await served.post("/v1/responses", json={**BODY, "stream": True}))
    assert [e["type"] for e in stream] == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.content_part.added", "response.output_text.delta",
        "response.output_text.delta", "response.output_text.done", "response.content_part.done",
        "response.output_item.done", "response.incomplete",
    ]  # fmt: skip
    assert (
        stream[0]["response"]["status"] == "in_progress" and stream[0]["response"]["usage"] is None
    )
    assert [e["delta"] for e in stream if e["type"] == "response.output_text.delta"] == [
        "Sunny", " and mild."]  # fmt: skip
    final = stream[-1]["response"]
    assert final["status"] == "incomplete"
    assert final["incomplete_details"] == {"reason": "max_output_tokens"}
    assert final["output"] == [stream[-2]["item"]] and final["usage"]["output_tokens"] == 2


async def test_function_calls_both_ways(served: Client, engine: FakeEngine) -> None:
    engine.script = replying(CALL[:20], CALL[20:])
    body = {**BODY, "tools": [WEATHER], "tool_choice": "required"}
    reply = await (await served.post("/v1/responses", json=body)).json()
    [call] = reply["output"]
    assert (call["type"], call["name"], call["status"]) == ("function_call", "get_weather",
                                                            "completed")  # fmt: skip
    assert json.loads(call["arguments"]) == {"city": "Paris"}
    assert reply["tools"][0]["name"] == "get_weather" and reply["tool_choice"] == "required"
    assert engine.submits[0].sampling.grammar.startswith("root ::= call")
    # The next turn sends the call and its output back (stateless: the whole conversation).
    output = {"type": "function_call_output", "call_id": call["call_id"], "output": "18 C"}
    turns = [{"role": "user", "content": BODY["input"]}, call, output]
    engine.script = replying("It is 18 C.")
    follow = {**BODY, "input": turns, "tools": [WEATHER]}
    answer = await (await served.post("/v1/responses", json=follow)).json()
    assert answer["output"][0]["content"][0]["text"] == "It is 18 C."
    prompt = await detokenized(served, engine.submits[1])
    assert '"city": "Paris"' in prompt and "<tool_response>\n18 C" in prompt


async def test_a_streamed_function_call(served: Client, engine: FakeEngine) -> None:
    engine.script = replying(CALL[:20], CALL[20:])
    body = {**BODY, "tools": [WEATHER], "stream": True}
    stream = await events(await served.post("/v1/responses", json=body))
    assert [e["type"] for e in stream] == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.function_call_arguments.delta", "response.function_call_arguments.done",
        "response.output_item.done", "response.completed",
    ]  # fmt: skip
    added, delta, done = stream[2], stream[3], stream[5]
    assert added["item"]["arguments"] == "" and added["item"]["status"] == "in_progress"
    assert (
        json.loads(delta["delta"]) == {"city": "Paris"} and delta["item_id"] == done["item"]["id"]
    )
    assert stream[-1]["response"]["output"] == [done["item"]]


async def test_text_format_is_the_grammar(served: Client, engine: FakeEngine) -> None:
    engine.script = replying('{"city": "Paris"}')
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    text = {"format": {"type": "json_schema", "name": "place", "schema": schema, "strict": True}}
    reply = await (await served.post("/v1/responses", json={**BODY, "text": text})).json()
    assert reply["text"] == text
    assert json.loads(reply["output"][0]["content"][0]["text"]) == {"city": "Paris"}
    assert "city" in engine.submits[0].sampling.grammar


BAD = [
    ({**BODY, "previous_response_id": "resp_1"}, "previous_response_id", "unsupported_parameter"),
    ({**BODY, "background": True}, "background", "unsupported_parameter"),
    ({**BODY, "input": []}, "input", "invalid_request"),
    ({**BODY, "input": [{"role": "user", "content": [{"image_url": "x"}]}]},
     "input[0].content[0]", "invalid_request"),
    ({**BODY, "tools": [{"name": "no_type"}]}, "tools[0]", "invalid_request"),
    ({**BODY, "tools": [WEATHER], "tool_choice": {"type": "function", "name": "nope"}},
     "tool_choice", "invalid_request"),
    ({**BODY, "max_output_tokens": 0}, "max_output_tokens", "invalid_request"),
    ({**BODY, "text": {"format": {"type": "yaml"}}}, "text.format", "invalid_request"),
]  # fmt: skip


@pytest.mark.parametrize(("body", "param", "code"), BAD)
async def test_bad_input_is_a_400_naming_the_field(
    served: Client, engine: FakeEngine, body: dict[str, Any], param: str, code: str
) -> None:
    error = await openai_error(await served.post("/v1/responses", json=body), 400)
    assert (error["param"], error["code"]) == (param, code), error
    assert not engine.submits


async def test_a_failure_after_the_start_is_response_failed(
    served: Client, engine: FakeEngine
) -> None:
    failure = {"finish_reason": protocol.FINISH_ERROR, "detail": "decode failed"}
    engine.script = lambda submit: [[accepted()], [{"token_ids": [1], "text": b"Hi"}], [failure]]
    stream = await events(await served.post("/v1/responses", json={**BODY, "stream": True}))
    assert [e["type"] for e in stream][-2:] == ["response.output_text.delta", "response.failed"]
    final = stream[-1]["response"]
    assert final["status"] == "failed"
    assert final["error"] == {"code": "server_error", "message": "decode failed",
                              "type": "engine_error"}  # fmt: skip
    engine.script = lambda submit: [[accepted()], [failure]]
    error = await openai_error(await served.post("/v1/responses", json=BODY), 500)
    assert (error["type"], error["message"]) == ("server_error", "decode failed")


# A request shaped as Codex 0.171 sends one (tests/agents: captured from it), cut down.
CODEX = {
    "model": "SmolLM2-135M-Instruct.Q4_1",
    "input": [
        {"type": "message", "role": "developer",
         "content": [{"type": "input_text", "text": "You are Codex."}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAA"},
        {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "exec_command",
         "arguments": '{"cmd": "cat hello.py"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "print('hi')"},
        {"type": "custom_tool_call", "call_id": "call_2", "name": "apply_patch", "input": "x"},
    ],
    "tools": [
        {"type": "function", "name": "exec_command", "strict": False, "parameters": {
            "type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"],
            "additionalProperties": False}},
        {"type": "namespace", "name": "multi_agent_v1", "tools": [
            {"type": "function", "name": "spawn_agent", "parameters": {"type": "object"}}]},
        {"type": "web_search", "external_web_access": False},
        {"type": "custom", "name": "apply_patch", "format": {"type": "grammar"}},
    ],
    "tool_choice": "auto",
    "parallel_tool_calls": True,
    "reasoning": {"summary": "auto"},
    "store": False,
    "stream": True,
    "include": ["reasoning.encrypted_content"],
    "prompt_cache_key": "thread-1",
    "client_metadata": {"x": "y"},
    "text": {"verbosity": "low"},
}  # fmt: skip


async def test_what_codex_sends_is_served_and_what_is_ignored_is_said(
    served: Client, engine: FakeEngine
) -> None:
    engine.script = lambda submit: [[accepted()], [{
        "token_ids": [1], "text": b"It prints hi.", "finish_reason": protocol.FINISH_STOP,
        "prompt_tokens": len(submit.prompt_ids)}]]  # fmt: skip
    response = await served.post("/v1/responses", json=CODEX)
    stream = await events(response)
    assert stream[-1]["type"] == "response.completed"
    assert response.headers["X-TinyServe-Ignored"] == (
        "input[](custom_tool_call), tools[](namespace), tools[](web_search), tools[](custom), "
        "text.verbosity, include, reasoning, client_metadata"
    )
    [submit] = engine.submits
    # No limit given: until it fills, within --max-tokens-limit (256 here).
    assert submit.max_tokens == min(256, N_CTX - len(submit.prompt_ids))
    prompt = await served.app[TOKENIZER].detokenize(submit.prompt_ids)
    assert "You are Codex." in prompt and "print('hi')" in prompt
    assert "spawn_agent" not in prompt and "apply_patch" not in prompt


async def test_a_format_beside_tools_is_a_call_or_that_format(
    served: Client, engine: FakeEngine
) -> None:
    engine.script = lambda submit: [
        [accepted()],
        [{"token_ids": [1], "text": b'{"answer": 4}', "finish_reason": protocol.FINISH_STOP}],
    ]
    schema = {"type": "object", "properties": {"answer": {"type": "integer"}},
              "required": ["answer"]}  # fmt: skip
    body = {
        **BODY,
        "tools": [WEATHER],
        "text": {"format": {"type": "json_schema", "name": "out", "schema": schema}},
    }
    reply = await (await served.post("/v1/responses", json=body)).json()
    assert reply["output"][0]["content"][0]["text"] == '{"answer": 4}'
    grammar = engine.submits[0].sampling.grammar
    assert "get_weather" in grammar and "answer" in grammar


async def test_a_calls_arguments_stream_as_they_are_written(
    served: Client, engine: FakeEngine
) -> None:
    from tests.frontend.anthropic.test_anthropic_handlers import CALL_PIECES

    engine.script = replying(*CALL_PIECES)
    body = {**BODY, "tools": [WEATHER], "stream": True}
    stream = await events(await served.post("/v1/responses", json=body))
    kinds = [e["type"] for e in stream]
    deltas = [e["delta"] for e in stream if e["type"] == "response.function_call_arguments.delta"]
    assert len(deltas) >= 2 and json.loads("".join(deltas)) == {"city": "Paris"}
    assert kinds.index("response.output_item.added") < kinds.index(
        "response.function_call_arguments.delta"
    )
    [done] = [e for e in stream if e["type"] == "response.function_call_arguments.done"]
    assert json.loads(done["arguments"]) == {"city": "Paris"}
    final = stream[-1]["response"]
    assert [item["type"] for item in final["output"]] == ["function_call"]
    assert final["output"][0]["call_id"] == done["item_id"].replace("fc_", "call_")
