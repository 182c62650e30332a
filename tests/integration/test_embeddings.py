"""``/v1/embeddings`` on a real node: vectors equal llama-cpp-python's own ``embed()`` on the
same model, the shapes the ``openai`` client and langchain-openai read, 400s that name the
field, and generation going on beside it."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Iterator

import aiohttp
import llama_cpp
import numpy as np
import openai
import pytest

from tinyserve.engine.runtime.weights import model_params, repack_weights
from tinyserve.model import resolve_model_path

from .node import Node

pytestmark = [pytest.mark.integration, pytest.mark.filterwarnings("error")]

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "A lighthouse keeper writes letters to the sea.",
    "def add(a, b):\n    return a + b",
    "hello",
]
MAX_TOKENS = 64  # --embedding-max-tokens


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    workdir = tmp_path_factory.mktemp("embeddings")
    flags = ("--slots", "2", "--embedding-max-tokens", str(MAX_TOKENS))
    node = Node(workdir, *flags, frontends=1).start()
    yield node
    node.stop()


@pytest.fixture(scope="module")
def client(node: Node) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{node.url}/v1", api_key="none", max_retries=0) as client:
        yield client


@pytest.fixture(scope="module")
def reference() -> Iterator[llama_cpp.Llama]:
    """llama-cpp-python's own embedder on the same model: mean pooling (the default model's
    GGUF names none), flash attention as llama.cpp's default picks it in the engine, weights
    loaded as the engine loads them."""
    with pytest.MonkeyPatch.context() as patch:
        engine_params = model_params(repack_weights("auto"))
        patch.setattr(llama_cpp.llama_cpp, "llama_model_default_params", lambda: engine_params)
        llm = llama_cpp.Llama(
            str(resolve_model_path(None)),
            embedding=True,
            pooling_type=llama_cpp.LLAMA_POOLING_TYPE_MEAN,
            flash_attn=True,
            n_ctx=512,
            n_batch=512,
            n_threads=1,
            verbose=False,
        )
    yield llm
    llm.close()


def cosine(a: list[float], b: list[float]) -> float:
    x, y = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(x @ y / (np.linalg.norm(x) * np.linalg.norm(y)))


def test_vectors_equal_llama_cpp_pythons_embed(
    client: openai.OpenAI, reference: llama_cpp.Llama
) -> None:
    model = client.models.list().data[0].id
    reply = client.embeddings.create(model=model, input=TEXTS)
    assert [d.index for d in reply.data] == [0, 1, 2, 3]
    want = reference.embed(TEXTS)
    for got, expected in zip(reply.data, want, strict=True):
        assert len(got.embedding) == 576
        assert cosine(got.embedding, expected) > 1 - 1e-4
        assert abs(float(np.linalg.norm(got.embedding)) - 1) < 1e-5  # L2-normalised
    tokens = sum(len(reference.tokenize(text.encode())) for text in TEXTS)
    assert (reply.usage.prompt_tokens, reply.usage.total_tokens) == (tokens, tokens)
    assert reply.model == model
    # one string: the same vector as in the list
    one = client.embeddings.create(model=model, input=TEXTS[1])
    assert len(one.data) == 1
    assert cosine(one.data[0].embedding, reply.data[1].embedding) > 1 - 1e-6


def test_token_ids_and_base64(client: openai.OpenAI, reference: llama_cpp.Llama) -> None:
    ids = [reference.tokenize(text.encode()) for text in TEXTS[:2]]
    model = client.models.list().data[0].id
    as_text = client.embeddings.create(model=model, input=TEXTS[:2])
    as_ids = client.embeddings.create(model=model, input=ids)
    as_one_list = client.embeddings.create(model=model, input=ids[0])
    for a, b in zip(as_text.data, as_ids.data, strict=True):
        assert cosine(a.embedding, b.embedding) > 1 - 1e-6
    assert cosine(as_one_list.data[0].embedding, as_text.data[0].embedding) > 1 - 1e-6
    # the openai client asks for base64 by default when numpy is there and decodes it itself;
    # read the raw reply to check the bytes are little-endian float32
    raw = client.embeddings.with_raw_response.create(
        model=model, input=TEXTS[0], encoding_format="base64"
    )
    text = raw.http_response.json()["data"][0]["embedding"]
    decoded = np.frombuffer(base64.b64decode(text), "<f4")
    assert cosine(decoded.tolist(), as_text.data[0].embedding) > 1 - 1e-7


def test_langchain_openai_embeddings(node: Node, client: openai.OpenAI) -> None:
    from langchain_openai import OpenAIEmbeddings

    # check_embedding_ctx_length=False: langchain would otherwise send OpenAI's tiktoken ids
    # (docs/api.md says so)
    embedder = OpenAIEmbeddings(
        model=client.models.list().data[0].id,
        base_url=f"{node.url}/v1",
        api_key="none",  # type: ignore[arg-type]
        check_embedding_ctx_length=False,
        max_retries=0,
    )
    documents = embedder.embed_documents(TEXTS[:3])
    query = embedder.embed_query("a fox and a dog")
    assert [len(v) for v in documents] == [576, 576, 576]
    # the query about a fox is nearest the sentence about one
    scores = [cosine(query, v) for v in documents]
    assert scores.index(max(scores)) == 0


@pytest.mark.parametrize(
    ("body", "param", "said"),
    [
        ({"input": ""}, "input", "empty"),
        ({"input": []}, "input", "at least 1"),
        ({"input": ["ok", ""]}, "input[1]", "empty"),
        ({"input": [[]]}, "input[0]", "at least 1"),
        ({"input": [1, 10**6]}, "input", "vocabulary"),
        ({"input": "word " * 200}, "input", "--embedding-max-tokens"),
        ({"input": ["ok", "word " * 200]}, "input[1]", "--embedding-max-tokens"),
        ({"input": [[1], [2, 10**6]]}, "input[1]", "vocabulary"),
        ({"input": "x", "encoding_format": "int8"}, "encoding_format", "float"),
        ({"input": "x", "dimensions": 3}, "dimensions", "576"),
        ({"input": 5}, "input", "must be"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(
    node: Node, body: dict[str, object], param: str, said: str
) -> None:
    async def post() -> tuple[int, dict[str, object]]:
        url = f"{node.url}/v1/embeddings"
        async with aiohttp.ClientSession() as session, session.post(url, json=body) as resp:
            return resp.status, await resp.json()

    status, reply = asyncio.run(post())
    error = reply["error"]
    assert status == 400, reply
    assert isinstance(error, dict)
    assert error["param"] == param and said in error["message"], error


def test_an_unknown_model_is_a_404(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="no-such-model", input="x")


def test_embeddings_and_a_stream_run_side_by_side(node: Node, client: openai.OpenAI) -> None:
    """A stream keeps getting tokens while a list of inputs is embedded a batch per tick, and
    both end whole; the engine counts the inputs it embedded."""

    async def embedded_inputs(session: aiohttp.ClientSession) -> float:
        async with session.get(f"{node.url}/metrics") as resp:
            text = await resp.text()
        line = next(
            x for x in text.splitlines() if x.startswith("tinyserve_embedding_inputs_total")
        )
        return float(line.split()[-1])

    model = client.models.list().data[0].id

    async def run() -> tuple[list[str], int, dict[str, object], float]:
        async with aiohttp.ClientSession() as session:
            before = await embedded_inputs(session)
            chat = {
                "model": model,
                "messages": [{"role": "user", "content": "Count from one to twenty."}],
                "max_tokens": 48,
                "temperature": 0,
                "stream": True,
            }

            async def stream() -> list[str]:
                url = f"{node.url}/v1/chat/completions"
                async with session.post(url, json=chat) as resp:
                    assert resp.status == 200
                    text = await resp.text()
                lines = [x[6:] for x in text.splitlines() if x.startswith("data: ")]
                assert lines[-1] == "[DONE]"
                events = [json.loads(x) for x in lines[:-1]]
                return [c["finish_reason"] for e in events for c in e["choices"]]

            async def embed() -> tuple[int, dict[str, object]]:
                body = {"input": TEXTS * 20}  # 80 inputs: several batches of 64 tokens
                async with session.post(f"{node.url}/v1/embeddings", json=body) as resp:
                    return resp.status, await resp.json()

            finishes, (status, reply) = await asyncio.gather(stream(), embed())
            return finishes, status, reply, await embedded_inputs(session) - before

    finishes, status, reply, counted = asyncio.run(run())
    assert counted == 80
    assert finishes[-1] == "length"
    assert status == 200
    data = reply["data"]
    assert isinstance(data, list) and len(data) == 80
    assert [d["index"] for d in data] == list(range(80))
    # the same text, the same vector, whichever batch it fell in
    assert cosine(data[0]["embedding"], data[4]["embedding"]) > 1 - 1e-6


def test_an_embedding_request_has_a_timeline(node: Node) -> None:
    """Queued, taken by the policy, a part per tick, done: GET /v1/requests/{id} shows it as
    it shows a generation's, its parts adding up to its tokens."""

    async def run() -> tuple[dict[str, object], dict[str, object]]:
        async with aiohttp.ClientSession() as session:
            url = f"{node.url}/v1/embeddings"
            body = {"input": TEXTS * 5, "tenant": "indexer"}
            async with session.post(url, json=body) as resp:
                assert resp.status == 200
                reply, request_id = await resp.json(), resp.headers["X-Request-Id"]
            async with session.get(f"{node.url}/v1/requests/{request_id}") as resp:
                assert resp.status == 200
                return reply, await resp.json()

    reply, timeline = asyncio.run(run())
    usage = reply["usage"]
    assert isinstance(usage, dict)
    assert (timeline["status"], timeline["tenant"]) == ("finished", "indexer")
    parts = timeline["prefill"]
    assert isinstance(parts, list) and parts
    assert sum(part["tokens"] for part in parts) == usage["prompt_tokens"]
    assert all(part["tokens"] <= MAX_TOKENS for part in parts)
    ticks = [part["tick"] for part in parts]
    assert ticks == sorted(set(ticks))  # one entry per tick, in order
    queue, finish = timeline["queue"], timeline["finish"]
    assert isinstance(queue, dict) and isinstance(finish, dict)
    assert queue["rule"].startswith("tenant=indexer")  # the default policy, wfq
    assert finish["reason"] == "stop"


def test_an_embedding_request_is_logged_and_counted_as_every_request(node: Node) -> None:
    """Through the one request pipeline: a ``request finished`` line with its id, route,
    tenant and prompt tokens, and ``tinyserve_requests_total``; a 400 about an input (raised
    while the request is already recorded) has its line too."""

    async def run() -> tuple[str, str, int, str]:
        async with aiohttp.ClientSession() as session:
            url = f"{node.url}/v1/embeddings"
            body = {"input": TEXTS[:2], "tenant": "logged"}
            async with session.post(url, json=body) as resp:
                assert resp.status == 200
                served, tokens = resp.headers["X-Request-Id"], (await resp.json())["usage"]
            body = {"input": ["word " * (2 * MAX_TOKENS)], "tenant": "logged"}
            async with session.post(url, json=body) as resp:
                assert resp.status == 400
                refused = resp.headers["X-Request-Id"]
            async with session.get(f"{node.url}/metrics") as resp:
                metrics = await resp.text()
            return served, refused, tokens["prompt_tokens"], metrics

    served, refused, prompt_tokens, metrics = asyncio.run(run())
    lines = {
        fields["request_id"]: fields
        for line in node.log().splitlines()
        if "request finished" in line
        for fields in [dict(kv.split("=", 1) for kv in line.split() if "=" in kv)]
    }
    assert lines[served]["route"] == "/v1/embeddings"
    assert (lines[served]["tenant"], lines[served]["status"]) == ("logged", "200")
    assert lines[served]["finish_reason"] == "stop"
    assert lines[served]["prompt_tokens"] == str(prompt_tokens)
    assert (lines[refused]["status"], lines[refused]["finish_reason"]) == ("400", "rejected")
    assert 'tinyserve_requests_total{code="200",finish_reason="stop"}' in metrics
    assert 'tinyserve_requests_total{code="400",finish_reason="rejected"}' in metrics
