"""Chat in the served model's own formats, through the handlers against the stand-in engine:
the prompt its template renders with tools, thinking and tool calls read from scripted
replies (whole and streamed), and the grammar a prompt's open reasoning block asks for."""

from __future__ import annotations

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
    [call] = deltas[3]["tool_calls"]
    assert call["index"] == 0 and call["function"]["name"] == "get_weather"
    assert deltas[4:] == [{}] and events[-2]["choices"][0]["finish_reason"] == "tool_calls"


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
