"""``--model-alias``: the ids a node answers to, when its operator closes the list."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from tests.frontend.harness import FakeEngine, accepted
from tinyserve import protocol
from tinyserve.config import Config, build_config

Client = TestClient[Any, Any]


@pytest.fixture
def config(tmp_path: Path) -> Config:
    return build_config(
        {"runtime_dir": str(tmp_path), "model_alias": ("gpt-4o", "claude-haiku-4-5")}, environ={}
    )


async def test_the_model_and_its_aliases_are_listed_and_served(
    served: Client, engine: FakeEngine
) -> None:
    listed = (await (await served.get("/v1/models")).json())["data"]
    assert [model["id"] for model in listed] == ["fake", "gpt-4o", "claude-haiku-4-5"]
    end = {"token_ids": [1], "text": b"Hi", "finish_reason": protocol.FINISH_STOP}
    engine.script = lambda submit: [[accepted(), end]]
    body = {"model": "claude-haiku-4-5", "max_tokens": 4,
            "messages": [{"role": "user", "content": "Hi"}]}  # fmt: skip
    reply = await served.post("/v1/messages", json=body)
    assert reply.status == 200 and (await reply.json())["model"] == "fake"


async def test_another_id_is_a_404_naming_the_model(served: Client, engine: FakeEngine) -> None:
    body = {"model": "gpt-5", "prompt": "Hi", "max_tokens": 4}
    response = await served.post("/v1/completions", json=body)
    assert response.status == 404
    error = (await response.json())["error"]
    assert (error["code"], error["param"]) == ("model_not_found", "model")
    assert engine.submits == []
