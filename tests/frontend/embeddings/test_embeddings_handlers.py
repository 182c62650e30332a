"""``POST /v1/embeddings`` against a fake engine: what the engine is sent, how each of its
endings becomes a reply, and what a client leaving or the engine going does."""

from __future__ import annotations

import asyncio
import base64
import struct
from typing import Any

from aiohttp.test_utils import TestClient

from tests.frontend.harness import EMBEDDING_SIZE, FakeEngine, until
from tinyserve import protocol
from tinyserve.frontend.request.state import CLIENT, EMBED_TOKENIZER, LINK, TOKENIZER

Client = TestClient[Any, Any]


async def test_inputs_go_tokenized_and_come_back_in_order(
    served: Client, engine: FakeEngine
) -> None:
    resp = await served.post("/v1/embeddings", json={"input": ["a cat", "a dog", "a cow"]})
    assert resp.status == 200, await resp.text()
    body = await resp.json()
    [embed] = engine.embeds
    tokenizer = served.app[EMBED_TOKENIZER]
    assert tokenizer is served.app[TOKENIZER]  # no --embedding-model: the served vocabulary
    assert embed.inputs == await tokenizer.tokenize_inputs(["a cat", "a dog", "a cow"])
    assert [d["index"] for d in body["data"]] == [0, 1, 2]
    assert [d["embedding"].index(1.0) for d in body["data"]] == [0, 1, 2]
    tokens = sum(len(ids) for ids in embed.inputs)
    assert body["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}
    assert (body["object"], body["model"]) == ("list", "fake")


async def test_base64_is_the_vectors_bytes(served: Client) -> None:
    body = {"input": [[1, 2], [3]], "encoding_format": "base64"}
    resp = await served.post("/v1/embeddings", json=body)
    data = (await resp.json())["data"]
    second = struct.unpack(f"<{EMBEDDING_SIZE}f", base64.b64decode(data[1]["embedding"]))
    assert second.index(1.0) == 1


async def test_a_full_engine_queue_is_a_503_with_retry_after(
    served: Client, engine: FakeEngine
) -> None:
    def refuse(embed: protocol.Embed) -> protocol.Embedded:
        return protocol.Embedded(
            embed.frontend_id, embed.request_id, protocol.FINISH_REJECTED,
            detail=protocol.REJECT_QUEUE_FULL,
        )  # fmt: skip

    engine.embedded = refuse
    resp = await served.post("/v1/embeddings", json={"input": "x"})
    assert resp.status == 503
    assert int(resp.headers["Retry-After"]) >= 1
    assert (await resp.json())["error"]["code"] == protocol.REJECT_QUEUE_FULL


async def test_an_engine_error_is_a_500(served: Client, engine: FakeEngine) -> None:
    def fail(embed: protocol.Embed) -> protocol.Embedded:
        return protocol.Embedded(
            embed.frontend_id, embed.request_id, protocol.FINISH_ERROR, detail="batch failed"
        )

    engine.embedded = fail
    resp = await served.post("/v1/embeddings", json={"input": "x"})
    assert resp.status == 500
    assert "batch failed" in (await resp.json())["error"]["message"]


async def test_a_client_that_leaves_cancels_the_work(served: Client, engine: FakeEngine) -> None:
    engine.embedded = lambda _embed: None  # never answers
    post = asyncio.create_task(served.post("/v1/embeddings", json={"input": "x"}))
    await until(lambda: len(engine.embeds) == 1)
    post.cancel()
    await until(lambda: len(engine.cancels) == 1)
    assert engine.cancels[0].request_id == engine.embeds[0].request_id
    assert not served.app[CLIENT]._embeddings


async def test_the_engine_going_away_is_a_503_engine_unavailable(
    served: Client, engine: FakeEngine
) -> None:
    engine.embedded = lambda _embed: None
    post = asyncio.create_task(served.post("/v1/embeddings", json={"input": "x"}))
    await until(lambda: len(engine.embeds) == 1)
    served.app[CLIENT].fail_all("engine_unavailable: gone")  # what the link does on a loss
    resp = await post
    assert resp.status == 503
    assert (await resp.json())["error"]["code"] == "engine_unavailable"


async def test_dimensions_other_than_the_models_are_a_400(served: Client) -> None:
    assert served.app[LINK].ack is not None
    ok = await served.post("/v1/embeddings", json={"input": "x", "dimensions": EMBEDDING_SIZE})
    assert ok.status == 200
    bad = await served.post("/v1/embeddings", json={"input": "x", "dimensions": 3})
    error = (await bad.json())["error"]
    assert (bad.status, error["param"]) == (400, "dimensions")
    assert str(EMBEDDING_SIZE) in error["message"]


async def test_a_full_embedding_queue_on_the_board_is_a_503_without_a_round_trip(
    served: Client, engine: FakeEngine
) -> None:
    engine.publish_load(embed_waiting=served.app[LINK].limits.max_queue)
    resp = await served.post("/v1/embeddings", json={"input": "x"})
    assert resp.status == 503
    assert int(resp.headers["Retry-After"]) >= 1
    assert (await resp.json())["error"]["code"] == protocol.REJECT_QUEUE_FULL
    assert engine.embeds == []  # refused from the board: the engine never saw it
