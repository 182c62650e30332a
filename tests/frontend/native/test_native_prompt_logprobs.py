"""``/generate``'s ``prompt_logprobs`` against the scripted stand-in engine."""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from tests.frontend.harness import FakeEngine, Tick, accepted
from tests.frontend.native.test_native_handlers import sse_events
from tinyserve import protocol

Client = TestClient[Any, Any]


def script(submit: protocol.Submit) -> list[Tick]:
    entries = [[-0.5 * (i + 1), [[7, -0.1], [8, -0.2]]] for i in range(len(submit.prompt_ids) - 1)]
    first: dict[str, Any] = accepted(prompt_logprobs=entries[:1])
    finish = {
        "token_ids": [1],
        "text": b"a",
        "prompt_logprobs": entries[1:],
        "finish_reason": protocol.FINISH_LENGTH,
        "prompt_tokens": len(submit.prompt_ids),
    }
    return [[first], [finish]]


@pytest.mark.parametrize("stream", [False, True])
async def test_prompt_logprobs_pair_each_prompt_token_with_its_entry(
    served: Client, engine: FakeEngine, stream: bool
) -> None:
    engine.script = script
    body = {"prompt": "The cat sat on the mat", "max_tokens": 1, "prompt_logprobs": 2}
    response = await served.post("/generate", json={**body, "stream": stream})
    # A stream's final event carries them, as the whole reply does.
    reply = (await sse_events(response))[-1] if stream else await response.json()
    [submit] = engine.submits
    assert submit.prompt_logprobs == 2
    entries = reply["prompt_logprobs"]
    assert entries[0] is None and len(entries) == len(submit.prompt_ids)
    assert [e["token_id"] for e in entries[1:]] == submit.prompt_ids[1:]
    assert [e["logprob"] for e in entries[1:]] == [-0.5 * (i + 1) for i in range(len(entries) - 1)]
    assert entries[1]["top_logprobs"] == [
        {"token_id": 7, "logprob": -0.1}, {"token_id": 8, "logprob": -0.2}
    ]  # fmt: skip


async def test_without_prompt_logprobs_there_are_none(served: Client, engine: FakeEngine) -> None:
    reply = await (await served.post("/generate", json={"prompt": "Hi"})).json()
    assert "prompt_logprobs" not in reply
    assert engine.submits[0].prompt_logprobs == -1


async def test_a_bad_count_is_a_400(served: Client) -> None:
    response = await served.post("/generate", json={"prompt": "Hi", "prompt_logprobs": 9})
    assert response.status == 400
    assert "'prompt_logprobs'" in (await response.json())["error"]["message"]
