"""The tokenizer routes (vLLM's shapes) through the frontend, with the model's real vocabulary."""

from __future__ import annotations

from typing import Any

import llama_cpp
import pytest
from aiohttp.test_utils import TestClient

from tests.frontend.harness import N_CTX, FakeEngine
from tinyserve.model import resolve_model_path

Client = TestClient[Any, Any]
TEXT = "Hello, world! Ünïcödé and 漢字 too."


@pytest.fixture(scope="module")
def vocab() -> llama_cpp.Llama:
    return llama_cpp.Llama(str(resolve_model_path(None)), vocab_only=True, verbose=False)


async def test_tokenize_matches_the_vocabulary_and_round_trips(
    served: Client, vocab: llama_cpp.Llama
) -> None:
    reply = await (await served.post("/tokenize", json={"prompt": TEXT})).json()
    expected = vocab.tokenize(TEXT.encode(), add_bos=True, special=True)
    assert reply["tokens"] == expected
    assert reply["count"] == len(expected)
    assert reply["max_model_len"] == N_CTX  # the engine's figure once it said so
    assert reply.get("token_strs") is None
    back = await (await served.post("/detokenize", json={"tokens": reply["tokens"]})).json()
    assert back == {"prompt": vocab.detokenize(expected, special=True).decode()}
    assert TEXT in back["prompt"]


async def test_add_special_tokens_false_leaves_bos_out_but_parses_special_text(
    served: Client, vocab: llama_cpp.Llama
) -> None:
    eos = vocab.detokenize([vocab.token_eos()], special=True).decode()
    body = {"prompt": "a" + eos, "add_special_tokens": False, "return_token_strs": True}
    reply = await (await served.post("/tokenize", json=body)).json()
    assert reply["tokens"][-1] == vocab.token_eos()
    assert reply["tokens"] == vocab.tokenize(("a" + eos).encode(), add_bos=False, special=True)
    assert "".join(reply["token_strs"]) == "a" + eos


async def test_tokenize_messages_renders_the_chat_template(served: Client) -> None:
    body = {"messages": [{"role": "user", "content": "Hi there"}]}
    reply = await (await served.post("/tokenize", json=body)).json()
    text = await (await served.post("/detokenize", json={"tokens": reply["tokens"]})).json()
    assert "Hi there" in text["prompt"]
    plain = await (await served.post("/tokenize", json={"prompt": "Hi there"})).json()
    assert reply["count"] > plain["count"]  # the template's markup is in it


TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {}}}
STORY = [
    {"role": "user", "content": "Tell me a story"},
    {"role": "assistant", "content": "Once upon a time"},
]


@pytest.mark.parametrize(
    "chat",
    [
        {"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": [TOOL]},
        {"messages": [{"role": "user", "content": "Weather?"}], "tools": [TOOL],
         "tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
        {"messages": STORY, "continue_final_message": True},
        {"messages": STORY, "add_generation_prompt": False},
    ],
)  # fmt: skip
async def test_tokenize_messages_counts_what_chat_completions_sends(
    served: Client, engine: FakeEngine, chat: dict[str, Any]
) -> None:
    reply = await (await served.post("/tokenize", json=chat)).json()
    completion = await served.post("/v1/chat/completions", json={"model": "fake", **chat})
    assert completion.status == 200, await completion.text()
    assert reply["tokens"] == engine.submits[-1].prompt_ids


async def test_tokenize_messages_describes_the_tools_unless_tool_choice_is_none(
    served: Client,
) -> None:
    messages = [{"role": "user", "content": "Weather?"}]
    plain = await (await served.post("/tokenize", json={"messages": messages})).json()
    offered = {"messages": messages, "tools": [TOOL], "return_token_strs": True}
    with_tools = await (await served.post("/tokenize", json=offered)).json()
    assert "get_weather" in "".join(with_tools["token_strs"])
    none = {**offered, "tool_choice": "none"}
    declined = await (await served.post("/tokenize", json=none)).json()
    assert declined["tokens"] == plain["tokens"] != with_tools["tokens"]


async def test_tokenizer_info(served: Client, vocab: llama_cpp.Llama) -> None:
    info = await (await served.get("/tokenizer_info")).json()
    assert info["eos_token"] == vocab.detokenize([vocab.token_eos()], special=True).decode()
    assert info["vocab_size"] == vocab.n_vocab()
    assert info["model_max_length"] == N_CTX
    assert isinstance(info["add_bos_token"], bool)
    assert info["chat_template"]  # the default model's GGUF carries one


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/tokenize", {}, "prompt"),
        ("/tokenize", {"prompt": "a", "messages": [{"role": "user", "content": "b"}]}, "prompt"),
        ("/tokenize", {"prompt": 5}, "prompt"),
        ("/tokenize", {"prompt": "a", "tools": [TOOL]}, "tools"),
        ("/tokenize", {"prompt": "a", "add_generation_prompt": True}, "add_generation_prompt"),
        ("/tokenize", {"prompt": "a", "continue_final_message": True}, "continue_final_message"),
        ("/tokenize", {"prompt": "a", "tool_choice": "auto"}, "tool_choice"),
        ("/tokenize", {"messages": STORY[:1], "tool_choice": "required"}, "tool_choice"),
        (
            "/tokenize",
            {"messages": STORY[:1], "continue_final_message": True},
            "continue_final_message",
        ),
        ("/tokenize", {"messages": STORY, "tools": [TOOL, TOOL]}, "tools"),
        ("/detokenize", {"tokens": [1, -1]}, "tokens"),
        ("/detokenize", {"tokens": [10**9]}, "tokens"),
        ("/detokenize", {"tokens": "abc"}, "tokens"),
    ],
)
async def test_bad_input_is_a_4xx_naming_the_field(
    served: Client, path: str, body: dict[str, Any], param: str
) -> None:
    response = await served.post(path, json=body)
    assert response.status in (400, 404), await response.text()
    error = (await response.json())["error"]  # the native shape: the message names the field
    assert f"'{param}'" in error["message"], error
