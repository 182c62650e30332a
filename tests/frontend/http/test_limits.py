"""Request limits, each a 4xx with a message naming it: body size, the time to send it,
prompt tokens, max_tokens, stop strings, requests in progress per frontend."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from tests.frontend.harness import FakeEngine, accepted, until, wait_serving
from tinyserve import protocol
from tinyserve.config import Config, build_config
from tinyserve.frontend.http.app import build_app
from tinyserve.frontend.request.state import GATE

Client = TestClient[Any, Any]
LONG_PROMPT = "one two three four five six seven eight nine ten"


@pytest.fixture
def config(tmp_path: Path) -> Config:
    limits = {"max_body_bytes": 4096, "max_prompt_tokens": 5, "max_connections": 2,
              "body_timeout": 0.5}  # fmt: skip
    return build_config(
        {"runtime_dir": str(tmp_path), "max_tokens_limit": 256, **limits}, environ={}
    )


@pytest.fixture
async def served(engine: FakeEngine, config: Config) -> AsyncIterator[Client]:
    async with TestClient(TestServer(build_app(config))) as client:
        await wait_serving(client)
        yield client


async def native_error(response: Any, status: int) -> dict[str, Any]:
    assert response.status == status, await response.text()
    error: dict[str, Any] = (await response.json())["error"]
    return error


async def openai_error(response: Any, status: int) -> dict[str, Any]:
    error = await native_error(response, status)
    assert set(error) == {"message", "type", "param", "code"}
    return error


def completion(**fields: Any) -> dict[str, Any]:
    return {"model": "fake", "prompt": "Hi", **fields}


async def test_body_over_the_limit_is_a_json_413_naming_it(served: Client) -> None:
    big = {"prompt": "a" * 5000}
    error = await native_error(await served.post("/generate", json=big), 413)
    assert error["type"] == "request_too_large" and "4096" in error["message"]
    openai = await openai_error(await served.post("/v1/completions", json=completion(**big)), 413)
    assert openai["code"] == "request_too_large" and "4096" in openai["message"]
    # Just under the limit is read and judged on its content.
    fits = {"prompt": "a" * 3000, "max_tokens": 1}
    assert (await served.post("/generate", json=fits)).status != 413


async def test_a_body_that_stops_arriving_is_a_408_and_frees_its_place(served: Client) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", served.server.port)
    head = (
        "POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        "Content-Length: 100\r\n\r\n"
    )
    writer.write(head.encode() + b'{"model": "fake", ')  # and then nothing more
    await until(lambda: served.app[GATE].in_progress == 1)
    headers = (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)).decode()
    status, *lines = headers.strip().split("\r\n")
    fields = dict(line.split(": ", 1) for line in lines)
    body = json.loads(await reader.readexactly(int(fields["Content-Length"])))
    writer.close()
    assert status.startswith("HTTP/1.1 408") and fields["Connection"] == "close"
    assert body["error"]["code"] == "request_timeout" and "body_timeout" in body["error"]["message"]
    assert served.app[GATE].in_progress == 0
    # A body that arrives in time is read whole.
    assert (await served.post("/v1/completions", json=completion(max_tokens=2))).status == 200


async def test_prompt_over_max_prompt_tokens_is_a_400_naming_it(
    served: Client, engine: FakeEngine
) -> None:
    error = await native_error(await served.post("/generate", json={"prompt": LONG_PROMPT}), 400)
    assert error["type"] == "prompt_too_long"
    assert "at most 5" in error["message"] and "max_prompt_tokens" in error["message"]
    response = await served.post("/v1/completions", json=completion(prompt=LONG_PROMPT))
    error = await openai_error(response, 400)
    assert (error["code"], error["param"]) == ("prompt_too_long", "prompt")
    token_ids = completion(prompt=list(range(6)))
    response = await served.post("/v1/completions", json=token_ids)
    assert (await openai_error(response, 400))["code"] == "prompt_too_long"
    chat = {"model": "fake", "messages": [{"role": "user", "content": LONG_PROMPT}]}
    error = await openai_error(await served.post("/v1/chat/completions", json=chat), 400)
    assert (error["code"], error["param"]) == ("prompt_too_long", "messages")
    assert engine.submits == []
    assert (await served.post("/generate", json={"prompt": "Hi"})).status == 200


async def test_max_tokens_over_the_limit_is_clamped_and_said_so(
    served: Client, engine: FakeEngine
) -> None:
    response = await served.post("/generate", json={"prompt": "Hi", "max_tokens": 257})
    assert response.status == 200
    assert response.headers["X-TinyServe-Ignored"] == "max_tokens (clamped to 256)"
    response = await served.post("/v1/completions", json=completion(max_tokens=10**6))
    assert response.status == 200, await response.text()
    assert response.headers["X-TinyServe-Ignored"] == "max_tokens (clamped to 256)"
    ok = await served.post("/generate", json={"prompt": "Hi", "max_tokens": 256})
    assert ok.status == 200 and "X-TinyServe-Ignored" not in ok.headers
    assert [s.max_tokens for s in engine.submits] == [256, 256, 256]


@pytest.mark.parametrize(
    ("stop", "words"),
    [([f"s{i}" for i in range(17)], "at most 16"), (["x" * 65], "1 to 64"), ([""], "1 to 64")],
)
async def test_stop_strings_over_the_limits_are_400s(
    served: Client, stop: list[str], words: str
) -> None:
    error = await native_error(
        await served.post("/generate", json={"prompt": "Hi", "stop": stop}), 400
    )
    assert words in error["message"]
    response = await served.post("/v1/completions", json=completion(stop=stop))
    assert words in (await openai_error(response, 400))["message"]


async def test_requests_over_max_connections_get_a_429_and_probes_still_answer(
    served: Client, engine: FakeEngine
) -> None:
    release = asyncio.Event()

    def held(submit: protocol.Submit) -> list[list[dict[str, Any]]]:
        return [[accepted(finish_reason="stop")]] if release.is_set() else []

    engine.script = held
    first = [asyncio.create_task(served.post("/generate", json={"prompt": "Hi"}))]
    first.append(asyncio.create_task(served.post("/v1/completions", json=completion())))
    await until(lambda: len(engine.submits) == 2)
    busy = await served.post("/generate", json={"prompt": "Hi"})
    error = await native_error(busy, 429)
    assert error["reason"] == "frontend_busy" and "limit of 2" in error["message"]
    assert busy.headers["Retry-After"] == "1"
    busy = await served.post("/v1/completions", json=completion())
    assert (await openai_error(busy, 429))["code"] == "frontend_busy"
    for path in ("/health", "/ready"):
        assert (await served.get(path)).status == 200
    for task in first:
        task.cancel()
    await until(lambda: len(engine.cancels) == 2)
    release.set()
    assert (await served.post("/generate", json={"prompt": "Hi"})).status == 200


async def test_an_empty_prompt_is_a_400_naming_it(served: Client, engine: FakeEngine) -> None:
    error = await native_error(await served.post("/generate", json={"prompt": ""}), 400)
    assert "'prompt'" in error["message"]
    for prompt in ("", []):
        response = await served.post("/v1/completions", json=completion(prompt=prompt))
        assert (await openai_error(response, 400))["param"] == "prompt"
    assert engine.submits == []
