"""The OpenAI-compatible API of a real node, driven by the official ``openai`` client.

Any warning fails a test: the client must parse every reply and SSE stream cleanly, and
``model_dump()`` re-serialises each object so that a value outside the client's types (say, a
finish_reason it does not know) shows up as a pydantic warning.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from .node import Node

pytestmark = [pytest.mark.integration, pytest.mark.filterwarnings("error")]

# One llama.cpp thread: on a 2-core machine shared with the frontends, the client and other
# test runs, two spinning decode threads made single requests up to 20x slower (measured).
ENGINE_THREADS = ("--threads", "1")
COUNTING = "1, 2, 3, 4, 5,"  # the model keeps counting: no early end-of-generation
API_KEY = "sk-tinyserve-test"
QUESTION = [{"role": "user", "content": "What is the capital of Germany?"}]


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    workdir = tmp_path_factory.mktemp("openai")
    # The node requires a key; the clients below send it the way the openai client does.
    (workdir / "keys").write_text(f"# test keys\n{API_KEY}\n")
    flags = ("--slots", "4", "--ctx-per-slot", "2048", "--api-key-file", str(workdir / "keys"))
    running = Node(workdir, *flags, *ENGINE_THREADS).start()
    yield running
    assert running.stop() == 0


@pytest.fixture(scope="module")
def client(node: Node) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{node.url}/v1", api_key=API_KEY, max_retries=0) as sync:
        yield sync


@pytest.fixture(scope="module")
def model(client: openai.OpenAI) -> str:
    [served] = client.models.list().data
    served.model_dump()
    return served.id


def async_client(url: str, api_key: str = API_KEY) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=api_key, max_retries=0)


def test_model_is_the_file_name(model: str) -> None:
    assert model == "SmolLM2-135M-Instruct.Q4_1"


def test_the_model_is_retrieved_by_its_id(client: openai.OpenAI, model: str) -> None:
    retrieved = client.models.retrieve(model)
    assert (retrieved.id, retrieved.owned_by) == (model, "tinyserve")
    assert retrieved == client.models.list().data[0]
    assert client.models.retrieve("gpt-4o") == retrieved  # one model, by any id


def test_chat_with_the_model_template(client: openai.OpenAI, model: str) -> None:
    reply = client.chat.completions.create(
        model=model, messages=QUESTION, max_tokens=24, temperature=0
    )
    reply.model_dump()
    [choice] = reply.choices
    assert choice.message.role == "assistant"
    assert "Berlin" in (choice.message.content or "")
    assert "<|im_" not in (choice.message.content or "")
    assert choice.finish_reason == "stop"
    assert reply.usage is not None and reply.usage.total_tokens == (
        reply.usage.prompt_tokens + reply.usage.completion_tokens
    )
    details = reply.usage.prompt_tokens_details
    assert details is not None and details.cached_tokens is not None


def cached_of(usage: Any) -> int:
    details = usage.prompt_tokens_details
    return int(details.cached_tokens or 0) if details is not None else 0


def test_completion_and_its_stream_agree(client: openai.OpenAI, model: str) -> None:
    body: dict[str, Any] = {"model": model, "prompt": COUNTING, "max_tokens": 12, "temperature": 0}
    whole = client.completions.create(**body)
    whole.model_dump()
    assert whole.choices[0].finish_reason == "length"
    assert whole.usage is not None and whole.usage.completion_tokens == 12
    with client.completions.create(
        **body, stream=True, stream_options={"include_usage": True}
    ) as stream:
        chunks = list(stream)
    for chunk in chunks:
        chunk.model_dump()
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage is not None
    counts = ("prompt_tokens", "completion_tokens", "total_tokens")
    assert [getattr(usage, n) for n in counts] == [getattr(whole.usage, n) for n in counts]
    # The stream came second: it may reuse part of the block the first one left cached.
    assert cached_of(usage) >= cached_of(whole.usage)


def test_stop_sequences(client: openai.OpenAI, model: str) -> None:
    body: dict[str, Any] = {"model": model, "prompt": COUNTING, "max_tokens": 16, "temperature": 0}
    free = client.completions.create(**body).choices[0].text
    assert " 8" in free
    stopped = client.completions.create(**body, stop=[" 8", "never"]).choices[0]
    assert (stopped.text, stopped.finish_reason) == (free[: free.index(" 8")], "stop")
    with client.completions.create(**body, stop=" 8", stream=True) as stream:
        assert "".join(c.choices[0].text for c in stream) == stopped.text


def test_same_seed_same_text(client: openai.OpenAI, model: str) -> None:
    def sample(seed: int) -> str:
        body = {"prompt": "Once upon a time", "max_tokens": 12, "temperature": 0.9}
        return client.completions.create(model=model, seed=seed, **body).choices[0].text

    first = sample(7)
    assert sample(7) == first
    assert sample(8) != first


def test_logprobs_shapes(client: openai.OpenAI, model: str) -> None:
    reply = client.completions.create(
        model=model, prompt=COUNTING, max_tokens=6, temperature=0, logprobs=3
    )
    reply.model_dump()
    logprobs = reply.choices[0].logprobs
    assert logprobs is not None and logprobs.tokens is not None
    assert "".join(logprobs.tokens) == reply.choices[0].text
    assert len(logprobs.token_logprobs or []) == len(logprobs.top_logprobs or []) == 6
    assert all(3 <= len(top) <= 4 for top in logprobs.top_logprobs or [])
    chat = client.chat.completions.create(
        model=model, messages=QUESTION, max_tokens=4, logprobs=True, top_logprobs=2
    )
    chat.model_dump()
    content = chat.choices[0].logprobs.content if chat.choices[0].logprobs else None
    assert content is not None and len(content) == chat.usage.completion_tokens  # type: ignore[union-attr]
    for token in content:
        assert token.logprob <= 0 and len(token.top_logprobs) == 2
        assert bytes(token.bytes or []).decode("utf-8", "replace") == token.token


def test_invalid_requests_raise_bad_request(client: openai.OpenAI, model: str) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=model, messages=QUESTION, n=17)
    assert isinstance(info.value.body, dict) and info.value.body["param"] == "n"
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=model, prompt="x", extra_body={"top_k": -1})


def test_unknown_fields_and_model_ids_are_served_and_said_so(
    client: openai.OpenAI, model: str
) -> None:
    raw = client.completions.with_raw_response.create(
        model="gpt-4o", prompt="x", max_tokens=2, extra_body={"frobnicate": 1}
    )
    assert raw.headers["X-TinyServe-Ignored"] == "frobnicate"
    assert raw.parse().model == model


def test_several_prompts_n_and_echo_parse_in_the_client(client: openai.OpenAI, model: str) -> None:
    reply = client.completions.create(
        model=model, prompt=["One, two,", "Red, green,"], n=2, max_tokens=3, seed=5,
        echo=True, logprobs=1,
    )  # fmt: skip
    reply.model_dump()
    assert [c.index for c in reply.choices] == [0, 1, 2, 3]
    assert all(c.text.startswith("One, two,") for c in reply.choices[:2])
    assert all(c.text.startswith("Red, green,") for c in reply.choices[2:])
    for choice in reply.choices:
        assert choice.logprobs is not None and choice.logprobs.token_logprobs is not None
        assert choice.logprobs.token_logprobs[0] is None
    chat = client.chat.completions.create(model=model, messages=QUESTION, n=2, max_tokens=4)
    chat.model_dump()
    assert [c.index for c in chat.choices] == [0, 1]
    stream = client.completions.create(
        model=model, prompt=["One, two,", "Red, green,"], n=2, max_tokens=3, stream=True
    )
    texts = ["", "", "", ""]
    for chunk in stream:
        chunk.model_dump()
        for choice in chunk.choices:
            texts[choice.index] += choice.text
    assert all(texts)


async def test_async_chat_stream_with_usage(node: Node, model: str) -> None:
    async with async_client(node.url) as client:
        stream = await client.chat.completions.create(
            model=model,
            messages=QUESTION,
            max_tokens=24,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"top_k": 40, "priority": 1, "tenant": "tests"},
        )
        chunks = [chunk async for chunk in stream]
        whole = await client.chat.completions.create(
            model=model, messages=QUESTION, max_tokens=24, temperature=0
        )
    for chunk in chunks:
        chunk.model_dump()
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].usage is not None and chunks[-1].usage == whole.usage


async def test_async_completion(node: Node, model: str) -> None:
    async with async_client(node.url) as client:
        reply = await client.completions.create(model=model, prompt=COUNTING, max_tokens=4)
    reply.model_dump()
    assert reply.id.startswith("cmpl-") and reply.model == model


async def test_a_wrong_key_raises_authentication_error(node: Node, model: str) -> None:
    async with async_client(node.url, api_key="sk-wrong") as client:
        with pytest.raises(openai.AuthenticationError) as raised:
            await client.completions.create(model=model, prompt=COUNTING, max_tokens=4)
        with pytest.raises(openai.AuthenticationError):
            await client.models.list()
    error = raised.value
    assert error.status_code == 401 and error.response.headers["www-authenticate"] == "Bearer"
    assert isinstance(error.body, dict) and error.body["code"] == "invalid_api_key"


async def test_admission_rejection_is_a_503(tmp_path: Path) -> None:
    small = Node(tmp_path, "--slots", "1", "--max-queue", "1", *ENGINE_THREADS, frontends=1)
    small.start()
    try:
        async with async_client(small.url) as client:
            model = (await client.models.list()).data[0].id
            results = await asyncio.gather(
                *(
                    client.completions.create(model=model, prompt=COUNTING, max_tokens=16)
                    for _ in range(4)
                ),
                return_exceptions=True,
            )
    finally:
        assert small.stop() == 0
    rejected = [r for r in results if isinstance(r, openai.APIStatusError)]
    assert rejected, results
    for error in rejected:
        assert isinstance(error, openai.InternalServerError) and error.status_code == 503
        assert int(error.response.headers["retry-after"]) >= 1
        assert isinstance(error.body, dict) and error.body["code"] == "queue_full"
    assert any(isinstance(r, openai.types.Completion) for r in results)
