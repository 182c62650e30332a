"""Chat in the served model's own formats, through the handlers against the stand-in engine:
the prompt its template renders with tools, thinking and tool calls read from scripted
replies (whole and streamed), and the grammar a prompt's open reasoning block asks for."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from tests.chat_templates import DEEPSEEK_R1_DISTILL, QWEN3, hf_render, model_with_template
from tests.frontend.harness import FakeEngine, Tick, accepted
from tests.frontend.openai.test_openai_handlers import chunks
from tinyserve import protocol
from tinyserve.config import Config, build_config

Client = TestClient[Any, Any]
WEATHER: Any = {
    "type": "function",
    "function": {"name": "get_weather",
                 "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},
}  # fmt: skip
ASK: Any = {"model": "fake", "messages": [{"role": "user", "content": "Weather in Paris?"}]}
QWEN_REPLY = [
    "<think>", "\nParis, so get_weather.", "\n</think>\n\n", "Checking", ".\n<tool_",
    'call>\n{"name": "get_weather", ', '"arguments": {"city": "Paris"}}\n</tool_call>',
]  # fmt: skip


@pytest.fixture(scope="module")
def model_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    directory = tmp_path_factory.mktemp("models")
    templates = {"qwen3": QWEN3, "deepseek-r1": DEEPSEEK_R1_DISTILL}
    return {name: model_with_template(t, directory, name) for name, t in templates.items()}


@pytest.fixture
def config(request: pytest.FixtureRequest, tmp_path: Path, model_files: dict[str, Path]) -> Config:
    """The frontend's config, serving the model ``request.param`` names (with more settings
    after it)."""
    model, *settings = request.param
    values = {"runtime_dir": str(tmp_path), "model": str(model_files[model])}
    return build_config(values | dict(settings), environ={})


def replying(*pieces: str) -> Callable[[protocol.Submit], list[Tick]]:
    """A script that sends ``pieces`` one a tick and ends with ``stop``."""

    def script(submit: protocol.Submit) -> list[Tick]:
        ticks = [[{"token_ids": [i + 5], "text": p.encode()}] for i, p in enumerate(pieces)]
        ticks[-1][0] |= {"finish_reason": protocol.FINISH_STOP,
                         "prompt_tokens": len(submit.prompt_ids)}  # fmt: skip
        return [[accepted()], *ticks]

    return script


QWEN = pytest.mark.parametrize("config", [("qwen3",)], indirect=True)
R1 = pytest.mark.parametrize("config", [("deepseek-r1",)], indirect=True)


@QWEN
async def test_the_prompt_is_the_templates_own_with_tools(
    served: Client, engine: FakeEngine
) -> None:
    body = {**ASK, "tools": [WEATHER]}
    assert (await served.post("/v1/chat/completions", json=body)).status == 200
    info = await (await served.get("/tokenizer_info")).json()
    detokenized = await served.post("/detokenize", json={"tokens": engine.submits[0].prompt_ids})
    expected = hf_render(
        QWEN3, messages=ASK["messages"], tools=[WEATHER], add_generation_prompt=True,
        bos_token=info["bos_token"], eos_token=info["eos_token"],
    )  # fmt: skip
    assert (await detokenized.json())["prompt"] == expected
    assert "<tools>\n" + '{"type": "function"' in expected  # the template's own offer


@QWEN
async def test_thinking_text_and_a_call_in_one_reply(served: Client, engine: FakeEngine) -> None:
    engine.script = replying(*QWEN_REPLY)
    reply = await (
        await served.post("/v1/chat/completions", json={**ASK, "tools": [WEATHER]})
    ).json()
    [choice] = reply["choices"]
    message = choice["message"]
    assert choice["finish_reason"] == "tool_calls"
    assert (message["reasoning_content"], message["content"]) == (
        "Paris, so get_weather.",
        "Checking.",
    )
    [call] = message["tool_calls"]
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}


@QWEN
async def test_a_stream_sends_thinking_then_text_then_the_call(
    served: Client, engine: FakeEngine
) -> None:
    engine.script = replying(*QWEN_REPLY)
    body = {**ASK, "tools": [WEATHER], "stream": True}
    events = await chunks(await served.post("/v1/chat/completions", json=body))
    deltas = [e["choices"][0]["delta"] for e in events[1:-1]]
    assert deltas[:3] == [
        {"reasoning_content": "Paris, so get_weather."}, {"content": "Checking"}, {"content": "."}
    ]  # fmt: skip
    # The call as it is written: its start once its name is, then its arguments, no text.
    [call] = deltas[3]["tool_calls"]
    function = {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    assert call == {"index": 0, "id": call["id"], "type": "function", "function": function}
    assert call["id"].startswith("call_") and "content" not in deltas[3]
    assert deltas[4:] == [{}] and events[-2]["choices"][0]["finish_reason"] == "tool_calls"


@QWEN
async def test_a_streamed_call_arrives_as_it_is_written_and_reassembles(
    served: Client, engine: FakeEngine
) -> None:
    """Two calls, each written over several updates: each starts once its name is written,
    its arguments follow piece by piece at its index, and what a client joins is the call the
    whole reply holds."""
    pieces = ['<tool_call>\n{"name": "get_weather", "arguments": ', '{"city": ', '"Par',
              'is"}}\n</tool_call>\n<tool_call>\n{"name": "get_weather", ',
              '"arguments": {"city": "Oslo"}}\n</tool_call>']  # fmt: skip
    engine.script = replying(*pieces)
    body = {**ASK, "tools": [WEATHER]}
    whole = await (await served.post("/v1/chat/completions", json=body)).json()
    events = await chunks(await served.post("/v1/chat/completions", json=body | {"stream": True}))
    entries = [c for e in events[1:-1] for c in e["choices"][0]["delta"].get("tool_calls", [])]
    written = [(c["index"], c["function"].get("name"), c["function"]["arguments"]) for c in entries]
    assert written == [
        (0, "get_weather", ""), (0, None, '{"city": '), (0, None, '"Par'), (0, None, 'is"}'),
        (1, "get_weather", '{"city": "Oslo"}'),
    ]  # fmt: skip
    joined: dict[int, dict[str, str]] = {}
    for entry in entries:
        call = joined.setdefault(entry["index"], {"id": "", "name": "", "arguments": ""})
        call["id"] += entry.get("id", "")
        call["name"] += entry["function"].get("name") or ""
        call["arguments"] += entry["function"]["arguments"]
    calls = whole["choices"][0]["message"]["tool_calls"]
    assert [(c["name"], json.loads(c["arguments"])) for c in joined.values()] == [
        (c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls
    ]
    assert all(c["id"].startswith("call_") for c in joined.values())
    assert events[-2]["choices"][0]["finish_reason"] == "tool_calls"


@R1
async def test_a_block_the_prompt_opened_is_thinking(served: Client, engine: FakeEngine) -> None:
    engine.script = replying("Two and ", "two.\n</th", "ink>\n\nFour.")
    reply = await (await served.post("/v1/chat/completions", json=ASK)).json()
    message = reply["choices"][0]["message"]
    assert (message["reasoning_content"], message["content"]) == ("Two and two.", "Four.")


@R1
async def test_a_grammar_built_for_an_opened_block_closes_it_first(
    served: Client, engine: FakeEngine
) -> None:
    engine.script = replying('</think>\n\n<tool_call>\n{"name": "get_weather", ',
                             '"arguments": {}}\n</tool_call>')  # fmt: skip
    body = {**ASK, "tools": [WEATHER], "tool_choice": "required"}
    reply = await (await served.post("/v1/chat/completions", json=body)).json()
    assert engine.submits[0].sampling.grammar.startswith('root ::= "</think>\\n\\n" (')
    [choice] = reply["choices"]
    assert choice["finish_reason"] == "tool_calls" and "reasoning_content" not in choice["message"]
    # A client's own grammar says all there is.
    grammar = 'root ::= "x"'
    await served.post("/v1/chat/completions", json={**ASK, "grammar": grammar})
    assert engine.submits[1].sampling.grammar == grammar


@pytest.mark.parametrize("config", [("deepseek-r1", ("reasoning_format", "none"))], indirect=True)
async def test_reasoning_format_none_leaves_thinking_in_the_content(
    served: Client, engine: FakeEngine
) -> None:
    engine.script = replying("Two and two.\n</think>\n\nFour.")
    reply = await (await served.post("/v1/chat/completions", json=ASK)).json()
    message = reply["choices"][0]["message"]
    assert message == {"role": "assistant", "content": "Two and two.\n</think>\n\nFour."}
    body = {**ASK, "tools": [WEATHER], "tool_choice": "required"}
    await served.post("/v1/chat/completions", json=body)
    assert engine.submits[1].sampling.grammar.startswith("root ::= call")


MESSAGES_ASK: Any = {
    **ASK, "max_tokens": 64, "thinking": {"type": "adaptive"},
    "tools": [{"name": "get_weather", "input_schema": WEATHER["function"]["parameters"]}],
}  # fmt: skip


@QWEN
async def test_messages_return_thinking_as_thinking_blocks(
    served: Client, engine: FakeEngine
) -> None:
    engine.script = replying(*QWEN_REPLY)
    reply = await (await served.post("/v1/messages", json=MESSAGES_ASK)).json()
    kinds = [block["type"] for block in reply["content"]]
    assert kinds == ["thinking", "text", "tool_use"]
    assert reply["content"][0]["thinking"] == "Paris, so get_weather."
    assert reply["content"][1]["text"] == "Checking."
    engine.script = replying(*QWEN_REPLY)
    response = await served.post("/v1/messages", json={**MESSAGES_ASK, "stream": True})
    events = [e for e in await sse_data(response) if e["type"] != "ping"]
    blocks = [e["content_block"]["type"] for e in events if e["type"] == "content_block_start"]
    assert blocks == ["thinking", "text", "tool_use"]
    thinking = [
        e["delta"] for e in events if e["type"] == "content_block_delta" and e["index"] == 0
    ]
    assert thinking[0] == {"type": "thinking_delta", "thinking": "Paris, so get_weather."}
    assert thinking[-1]["type"] == "signature_delta" and thinking[-1]["signature"]
    assert "<think>" not in json.dumps(events)


@QWEN
async def test_responses_return_thinking_as_a_reasoning_item(
    served: Client, engine: FakeEngine
) -> None:
    tools = [{"type": "function", "name": "get_weather", **WEATHER["function"]}]
    body = {"model": "fake", "input": "Weather in Paris?", "tools": tools}
    engine.script = replying(*QWEN_REPLY)
    reply = await (await served.post("/v1/responses", json=body)).json()
    assert [item["type"] for item in reply["output"]] == ["reasoning", "message", "function_call"]
    assert reply["output"][0]["content"] == [
        {"type": "reasoning_text", "text": "Paris, so get_weather."}
    ]
    engine.script = replying(*QWEN_REPLY)
    events = await sse_data(await served.post("/v1/responses", json={**body, "stream": True}))
    kinds = [e["type"] for e in events]
    assert kinds[2:5] == [
        "response.output_item.added", "response.reasoning_text.delta",
        "response.reasoning_text.done",
    ]  # fmt: skip
    final = events[-1]["response"]
    assert [item["type"] for item in final["output"]] == ["reasoning", "message", "function_call"]
    assert [e["output_index"] for e in events if e["type"] == "response.output_item.done"] == [
        0, 1, 2
    ]  # fmt: skip


async def sse_data(response: Any) -> list[dict[str, Any]]:
    """The data of every event of an SSE body."""
    assert response.status == 200, await response.text()
    body = (await response.read()).decode()
    return [
        json.loads(line.removeprefix("data: "))
        for event in body.split("\n\n")
        for line in event.split("\n")
        if line.startswith("data: ")
    ]
