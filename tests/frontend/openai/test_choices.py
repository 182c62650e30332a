"""Several choices in one OpenAI reply (a list of prompts, n > 1, echo), against the scripted
stand-in engine: what is submitted, and how the choices come back."""

from __future__ import annotations

import json
from typing import Any

from aiohttp.test_utils import TestClient

from tests.frontend.harness import FakeEngine, Tick, accepted, until
from tinyserve import protocol

Client = TestClient[Any, Any]
COMPLETION = {"model": "fake", "prompt": "Hi"}


def echo_script(submit: protocol.Submit) -> list[Tick]:
    """Prompt logprobs when asked (-0.5 - i/10 for prompt token i + 1), then max_tokens
    tokens "x" (id 87) at -1.0 each."""
    prompt = submit.prompt_ids
    first: dict[str, Any] = accepted()
    if submit.prompt_logprobs >= 0:
        first["prompt_logprobs"] = [[-0.5 - i / 10, [[t, -0.25]]] for i, t in enumerate(prompt[1:])]
    ticks: list[Tick] = [[first]]
    for _ in range(submit.max_tokens):
        ticks.append([{"token_ids": [87], "text": b"x", "logprobs": [[-1.0, [[87, -1.0]]]]}])
    ticks.append([{"finish_reason": protocol.FINISH_LENGTH, "prompt_tokens": len(prompt)}])
    return ticks


async def test_a_list_of_prompts_gives_a_choice_per_prompt_in_order(
    served: Client, engine: FakeEngine
) -> None:
    engine.script = echo_script
    body = {**COMPLETION, "prompt": ["One", [5, 6, 7]], "max_tokens": 2}
    reply = await (await served.post("/v1/completions", json=body)).json()
    assert [c["index"] for c in reply["choices"]] == [0, 1]
    assert [c["text"] for c in reply["choices"]] == ["xx", "xx"]
    by_prompt = {tuple(s.prompt_ids): s for s in engine.submits}
    assert (5, 6, 7) in by_prompt and len(engine.submits) == 2
    assert all(s.fork_of == "" for s in engine.submits)
    prompt_tokens = sum(len(s.prompt_ids) for s in engine.submits)
    assert reply["usage"]["prompt_tokens"] == prompt_tokens
    assert reply["usage"]["completion_tokens"] == 4


async def test_n_choices_share_the_first_ones_prefill_and_seed_plus_index(
    served: Client, engine: FakeEngine
) -> None:
    engine.script = echo_script
    body = {**COMPLETION, "n": 3, "seed": 5, "max_tokens": 1}
    reply = await (await served.post("/v1/completions", json=body)).json()
    assert [c["index"] for c in reply["choices"]] == [0, 1, 2]
    first, *others = engine.submits  # submitted in order: the first prefills
    assert first.fork_of == "" and all(s.fork_of == first.request_id for s in others)
    assert [s.sampling.seed for s in engine.submits] == [5, 6, 7]
    assert reply["id"] == "cmpl-" + first.request_id
    assert reply["usage"]["prompt_tokens"] == len(first.prompt_ids)  # counted once
    assert reply["usage"]["completion_tokens"] == 3


async def test_chat_n(served: Client, engine: FakeEngine) -> None:
    body = {"model": "fake", "messages": [{"role": "user", "content": "Hi"}], "n": 2}
    reply = await (await served.post("/v1/chat/completions", json=body)).json()
    assert [c["message"]["content"] for c in reply["choices"]] == ["Hello", "Hello"]
    assert [c["index"] for c in reply["choices"]] == [0, 1]
    assert engine.submits[1].fork_of == engine.submits[0].request_id


async def test_echo_with_logprobs_and_max_tokens_0(served: Client, engine: FakeEngine) -> None:
    engine.script = echo_script
    body = {**COMPLETION, "prompt": [10, 11, 12], "echo": True, "logprobs": 1, "max_tokens": 0}
    reply = await (await served.post("/v1/completions", json=body)).json()
    [submit] = engine.submits
    assert (submit.prompt_logprobs, submit.max_tokens) == (1, 0)
    [choice] = reply["choices"]
    logprobs = choice["logprobs"]
    assert logprobs["token_logprobs"] == [None, -0.5, -0.6]
    assert logprobs["top_logprobs"][0] is None and len(logprobs["top_logprobs"]) == 3
    assert choice["text"] == "".join(logprobs["tokens"])  # the prompt's text, token by token
    offsets = [0]
    for token in logprobs["tokens"][:-1]:
        offsets.append(offsets[-1] + len(token))
    assert logprobs["text_offset"] == offsets
    assert reply["usage"]["completion_tokens"] == 0


async def test_echo_then_the_generated_tokens(served: Client, engine: FakeEngine) -> None:
    engine.script = echo_script
    body = {**COMPLETION, "prompt": "Hello there", "echo": True, "logprobs": 0, "max_tokens": 2}
    reply = await (await served.post("/v1/completions", json=body)).json()
    [choice] = reply["choices"]
    assert choice["text"] == "Hello therexx"
    [submit] = engine.submits
    logprobs = choice["logprobs"]["token_logprobs"]
    assert len(logprobs) == len(submit.prompt_ids) + 2
    assert logprobs[-2:] == [-1.0, -1.0]


async def sse(response: Any) -> list[Any]:
    """The payloads of an SSE body: JSON objects, then "[DONE]"."""
    assert response.status == 200, await response.text()
    events = (await response.read()).decode().split("\n\n")[:-1]
    payloads = [e.removeprefix("data: ") for e in events]
    return [json.loads(p) for p in payloads[:-1]] + [payloads[-1]]


async def test_several_choices_stream_each_at_its_index(served: Client, engine: FakeEngine) -> None:
    engine.script = echo_script
    body = {**COMPLETION, "prompt": ["a", "b"], "n": 2, "max_tokens": 2, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    payloads = await sse(await served.post("/v1/completions", json=body))
    assert payloads[-1] == "[DONE]"
    usage = payloads[-2]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 8
    chunks = [c for p in payloads[:-2] for c in p["choices"]]
    for index in range(4):
        mine = [c for c in chunks if c["index"] == index]
        assert "".join(c["text"] for c in mine) == "xx"
        assert [c["finish_reason"] for c in mine if c["finish_reason"]] == ["length"]
    assert len(engine.submits) == 4
    # As OpenAI's: every chunk of the call carries its one id, the first choice's.
    assert {p["id"] for p in payloads[:-1]} == {"cmpl-" + engine.submits[0].request_id}


async def test_chat_n_streams(served: Client, engine: FakeEngine) -> None:
    body = {"model": "fake", "messages": [{"role": "user", "content": "Hi"}], "n": 2,
            "stream": True}  # fmt: skip
    payloads = await sse(await served.post("/v1/chat/completions", json=body))
    deltas = [c for p in payloads[:-1] for c in p["choices"]]
    for index in (0, 1):
        mine = [c for c in deltas if c["index"] == index]
        assert mine[0]["delta"] == {"role": "assistant", "content": ""}
        assert "".join(c["delta"].get("content", "") for c in mine) == "Hello"
    assert len({p["id"] for p in payloads[:-1]}) == 1


async def test_echo_does_not_stream(served: Client, engine: FakeEngine) -> None:
    body = {**COMPLETION, "stream": True, "echo": True}
    response = await served.post("/v1/completions", json=body)
    assert response.status == 400
    assert (await response.json())["error"]["param"] == "echo"
    assert engine.submits == []


async def test_a_stream_of_choices_ends_with_an_error_event_when_one_fails(
    served: Client, engine: FakeEngine
) -> None:
    def script(submit: protocol.Submit) -> list[Tick]:
        if submit.fork_of:
            return [[accepted()], [{"finish_reason": protocol.FINISH_ERROR, "detail": "boom"}]]
        return [[accepted()]] + [[{"token_ids": [1], "text": b"a"}]] * 200  # never ends

    engine.script = script
    body = {**COMPLETION, "n": 2, "stream": True}
    payloads = await sse(await served.post("/v1/completions", json=body))
    assert payloads[-1] == "[DONE]" and "boom" in payloads[-2]["error"]["message"]
    first = engine.submits[0].request_id

    async def cancelled() -> bool:
        return any(c.request_id == first for c in engine.cancels)

    await until(cancelled)


async def test_one_failing_choice_fails_the_call_and_cancels_the_others(
    served: Client, engine: FakeEngine
) -> None:
    def script(submit: protocol.Submit) -> list[Tick]:
        if submit.fork_of:
            return [[accepted()], [{"finish_reason": protocol.FINISH_ERROR, "detail": "boom"}]]
        return [[accepted()]] + [[{"token_ids": [1], "text": b"a"}]] * 200  # never ends

    engine.script = script
    response = await served.post("/v1/completions", json={**COMPLETION, "n": 2})
    assert response.status == 500
    assert "boom" in (await response.json())["error"]["message"]
    first = engine.submits[0].request_id

    async def cancelled() -> bool:
        return any(c.request_id == first for c in engine.cancels)

    await until(cancelled)


async def test_a_prompt_list_naming_ids_outside_the_vocabulary_is_a_400(
    served: Client, engine: FakeEngine
) -> None:
    # The bad list is the first of two: before the check it was detokenized for the reply,
    # and llama.cpp aborted the frontend.
    body = {**COMPLETION, "prompt": [[213, 1048577], [100]], "max_tokens": 2}
    resp = await served.post("/v1/completions", json=body)
    assert resp.status == 400
    error = (await resp.json())["error"]
    assert error["param"] == "prompt" and "1048577 is not in the vocabulary" in error["message"]
    assert engine.submits == []


async def test_chat_n_with_tools_parses_each_choices_calls(
    served: Client, engine: FakeEngine
) -> None:
    call = b'<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'

    def script(submit: protocol.Submit) -> list[Tick]:
        text = b"It is sunny." if submit.fork_of else call
        finish = {"finish_reason": protocol.FINISH_STOP, "prompt_tokens": len(submit.prompt_ids)}
        return [[accepted()], [{"token_ids": [1], "text": text, **finish}]]

    engine.script = script
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {}}}
    body = {"model": "fake", "messages": [{"role": "user", "content": "Weather?"}], "n": 2,
            "tools": [tool]}  # fmt: skip
    response = await served.post("/v1/chat/completions", json=body)
    assert response.status == 200, await response.text()
    first, second = (await response.json())["choices"]
    assert first["finish_reason"] == "tool_calls"
    assert first["message"]["tool_calls"][0]["function"]["name"] == "get_weather"
    assert (second["finish_reason"], second["message"]["content"]) == ("stop", "It is sunny.")


async def test_echo_without_logprobs_asks_the_engine_for_none(
    served: Client, engine: FakeEngine
) -> None:
    engine.script = echo_script
    body = {**COMPLETION, "prompt": "Hello there", "echo": True, "max_tokens": 1}
    [choice] = (await (await served.post("/v1/completions", json=body)).json())["choices"]
    assert (choice["text"], choice["logprobs"]) == ("Hello therex", None)
    assert engine.submits[0].prompt_logprobs == -1  # no logits for the prompt's rows
