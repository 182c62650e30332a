"""Hand-made malformed requests against a real node, on each generation route (issue 8).

Raw bytes go out as they are (aiohttp ``data=`` with an explicit Content-Type), so nothing on
the client side repairs them. Every case must be a 4xx JSON error in the route's own shape
(native ``{"error": {"type", "message"}}``, OpenAI ``{"error": {"message", "type", "param",
"code"}}``), and the node must still serve afterwards with its board back at idle.

NUL and other control characters are valid characters of a JSON string: in a prompt or a stop
string they are served (the tokenizer sees them, nothing is cut at a NUL); in a tenant name,
whose alphabet is fixed, they are a 400.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from tinyserve_native.board import Board

from .node import Node, sse_events

pytestmark = pytest.mark.integration

JSON = "application/json"
ROUTES = ("/generate", "/v1/completions", "/v1/chat/completions")
DEPTH = 100_000  # far past Python's recursion limit (1000)


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    flags = ("--max-tokens-limit", "8", "--default-max-tokens", "4", "--ctx-per-slot", "512")
    running = Node(tmp_path_factory.mktemp("malformed"), *flags, frontends=1).start()
    yield running
    assert running.stop() == 0


@pytest.fixture(scope="module")
def model(node: Node) -> str:
    async def served() -> str:
        async with aiohttp.ClientSession() as session, session.get(f"{node.url}/v1/models") as r:
            return str((await r.json())["data"][0]["id"])

    return asyncio.run(served())


def valid_body(route: str, model: str, **fields: Any) -> dict[str, Any]:
    """A minimal valid body for ``route`` with ``fields`` added or replaced."""
    prompt = fields.pop("prompt", "Hello")
    if route == "/generate":
        body: dict[str, Any] = {"prompt": prompt, "max_tokens": 2}
    elif route == "/v1/completions":
        body = {"model": model, "prompt": prompt, "max_tokens": 2}
    else:
        messages = [{"role": "user", "content": prompt}]
        body = {"model": model, "messages": messages, "max_tokens": 2}
    return {**body, **fields}


def raw(route: str, model: str, template: str) -> bytes:
    """``template`` with ``{body}`` replaced by the route's valid body without its closing
    brace, so a case can append raw JSON text of its own: ``{body}, "seed": 1e400}``."""
    text = json.dumps(valid_body(route, model))
    return template.replace("{body}", text[:-1]).encode("utf-8", "surrogatepass")


async def post(
    url: str, data: bytes, content_type: str | None = JSON
) -> tuple[int, dict[str, str], Any]:
    # aiohttp would label raw bytes application/octet-stream; None sends no Content-Type.
    headers = {} if content_type is None else {"Content-Type": content_type}
    skip = [] if content_type is not None else ["Content-Type"]
    async with (
        aiohttp.ClientSession(skip_auto_headers=skip) as session,
        session.post(url, data=data, headers=headers) as r,
    ):
        return r.status, dict(r.headers), await r.read()


def assert_client_error(route: str, status: int, headers: dict[str, str], body: bytes) -> str:
    """A 4xx with a JSON error body in the route's shape; returns the message."""
    assert 400 <= status < 500, (status, body[:300])
    assert headers["Content-Type"].startswith(JSON)
    error = json.loads(body)["error"]
    if route.startswith("/v1/"):
        assert set(error) == {"message", "type", "param", "code"}, error
        assert error["type"] == "invalid_request_error"
    else:
        assert {"type", "message"} <= set(error) <= {"type", "message", "reason"}, error
    assert isinstance(error["message"], str) and error["message"]
    return str(error["message"])


# (name, raw body builder) -> each must be a 4xx naming the problem.
BROKEN_BODIES: list[tuple[str, str]] = [
    ("invalid UTF-8 in a string", '{body}, "tenant": "\udcff"}'),
    ("not JSON", "this is not JSON"),
    ("truncated JSON", '{body}, "seed": '),
    ("a JSON array", "[1, 2, 3]"),
    ("a JSON string", '"a prompt"'),
    ("JSON null", "null"),
    ("an empty body", ""),
    ("max_tokens 1e400", '{body}, "max_tokens": 1e400}'),
    ("max_tokens 2**70", '{body}, "max_tokens": ' + str(2**70) + "}"),
    ("seed 1e400", '{body}, "seed": 1e400}'),
    ("seed 2**70", '{body}, "seed": ' + str(2**70) + "}"),
    ("priority -1e400", '{body}, "priority": -1e400}'),
    ("priority 2**70", '{body}, "priority": ' + str(2**70) + "}"),
    ("top_k 2**70", '{body}, "top_k": ' + str(2**70) + "}"),
    ("temperature 1e400", '{body}, "temperature": 1e400}'),
    ("temperature NaN", '{body}, "temperature": NaN}'),
    ("nested arrays", "[" * DEPTH + "]" * DEPTH),
    ("nested objects", '{"a": ' * DEPTH + "1" + "}" * DEPTH),
    ("nested arrays in a field", '{body}, "stop": ' + "[" * DEPTH + "]" * DEPTH + "}"),
    ("NUL in tenant", '{body}, "tenant": "a\\u0000b"}'),
    ("control character in tenant", '{body}, "tenant": "a\\u001bb"}'),
    ("newline in tenant", '{body}, "tenant": "a\\nb"}'),
    ("lone surrogate in stop", '{body}, "stop": ["\\udc00"]}'),
]
ZERO_TOKEN_PROMPTS: dict[str, list[Any]] = {
    "/generate": [""],
    "/v1/completions": ["", [], [[]], [""]],
    "/v1/chat/completions": [],  # a chat prompt always holds the template's tokens
}


def _utf8_breaker(data: bytes) -> bytes:
    # The template is text; the invalid byte goes in as bytes (0xff never occurs in UTF-8).
    return data.replace("\udcff".encode("utf-8", "surrogatepass"), b"\xff")


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize(("name", "template"), BROKEN_BODIES, ids=[n for n, _ in BROKEN_BODIES])
async def test_broken_body_is_a_4xx(
    node: Node, model: str, route: str, name: str, template: str
) -> None:
    data = _utf8_breaker(raw(route, model, template))
    assert_client_error(route, *await post(node.url + route, data))
    await assert_node_healthy(node)


@pytest.mark.parametrize("route", ROUTES)
async def test_duplicate_keys_are_a_400(node: Node, model: str, route: str) -> None:
    # Two parsers could read different values from one body (a proxy the first, we the last);
    # refusing it is the only reading that cannot be smuggled past a check upstream.
    data = raw(route, model, '{body}, "max_tokens": 1, "max_tokens": 2}')
    message = assert_client_error(route, *await post(node.url + route, data))
    assert "max_tokens" in message


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize(
    "content_type", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data"]
)
async def test_wrong_content_type_is_a_415(
    node: Node, model: str, route: str, content_type: str
) -> None:
    data = json.dumps(valid_body(route, model)).encode()
    status, headers, body = await post(node.url + route, data, content_type)
    assert status == 415
    assert_client_error(route, status, headers, body)


@pytest.mark.parametrize("route", ROUTES)
async def test_json_content_types_are_accepted(node: Node, model: str, route: str) -> None:
    data = json.dumps(valid_body(route, model)).encode()
    for content_type in ("application/json; charset=utf-8", "application/vnd.api+json", None):
        status, _, body = await post(node.url + route, data, content_type)
        assert status == 200, (content_type, body[:300])


@pytest.mark.parametrize("route", ROUTES)
async def test_zero_token_prompts_are_a_400(node: Node, model: str, route: str) -> None:
    for prompt in ZERO_TOKEN_PROMPTS[route]:
        data = json.dumps(valid_body(route, model, prompt=prompt)).encode()
        message = assert_client_error(route, *await post(node.url + route, data))
        assert "prompt" in message
    if route == "/v1/chat/completions":
        data = json.dumps(valid_body(route, model, messages=[])).encode()
        assert "messages" in assert_client_error(route, *await post(node.url + route, data))


@pytest.mark.parametrize("route", ROUTES)
async def test_nul_and_control_characters_in_text_are_served_whole(
    node: Node, model: str, route: str
) -> None:
    tokens = {}
    for prompt in ("a b", "a\u0000b", "a\u0001\u001b\u007fb"):
        body = valid_body(route, model, prompt=prompt, stop=["\u0000", "\u001b[0m"])
        status, _, reply = await post(node.url + route, json.dumps(body).encode())
        assert status == 200, reply[:300]
        tokens[prompt] = json.loads(reply)["usage"]["prompt_tokens"]
    # Nothing is cut at the NUL: the prompt holds a token for it and for what follows.
    assert tokens["a\u0000b"] >= tokens["a b"]
    assert tokens["a\u0001\u001b\u007fb"] > tokens["a b"]


async def test_a_stream_after_the_malformed_requests_still_ends_with_a_final_event(
    node: Node,
) -> None:
    body = {"prompt": "Hello", "max_tokens": 4, "stream": True}
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{node.url}/generate", json=body) as resp,
    ):
        assert resp.status == 200
        events = [event async for event in sse_events(resp)]
    assert events[-1]["finish_reason"] in {"stop", "length"}
    await assert_node_healthy(node)


async def assert_node_healthy(node: Node) -> None:
    """``/ready`` answers 200 and the board shows no request, slot or block held."""
    async with aiohttp.ClientSession() as session, session.get(f"{node.url}/ready") as r:
        assert r.status == 200
    board = Board.attach(str(node.runtime_dir / "board"))
    try:
        deadline = time.monotonic() + 30
        while (snap := board.snapshot()).running or snap.waiting or snap.blocks_used:
            assert time.monotonic() < deadline, f"board not idle: {snap}"
            await asyncio.sleep(0.05)
    finally:
        board.close()
