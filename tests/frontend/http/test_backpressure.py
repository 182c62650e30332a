"""Slow and stalled readers over real TCP, against the scripted stand-in engine.

The client is a raw socket with a small receive buffer, so the server's writes really wait.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from tests.frontend.harness import FakeEngine, accepted, until, wait_serving
from tests.frontend.request.test_meters import delta, scrape
from tinyserve import protocol
from tinyserve.config import Config, build_config
from tinyserve.frontend.http.app import build_app
from tinyserve.frontend.request.state import CLIENT

Client = TestClient[Any, Any]
TICKS = 3000


@pytest.fixture
def config(tmp_path: Path) -> Config:
    return build_config({"runtime_dir": str(tmp_path), "write_timeout": 1.0}, environ={})


@pytest.fixture
async def served(engine: FakeEngine, config: Config) -> AsyncIterator[Client]:
    async with TestClient(TestServer(build_app(config))) as client:
        await wait_serving(client)
        yield client


def long_script(piece: bytes, ticks: int) -> Any:
    def script(submit: protocol.Submit) -> list[list[dict[str, Any]]]:
        body = [[{"token_ids": [7], "text": piece}] for _ in range(ticks)]
        end = [[{"token_ids": [7], "text": piece, "finish_reason": protocol.FINISH_LENGTH}]]
        return [[accepted()], *body, *end]

    return script


async def open_stream(
    port: int, body: dict[str, Any], path: str = "/generate", headers: str = ""
) -> tuple[Any, Any]:
    """A raw HTTP/1.1 request from a socket with a small receive buffer; ``headers`` are
    extra header lines, each ending in CRLF."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    # limit: asyncio's reader stops taking from the socket beyond twice this.
    reader, writer = await asyncio.open_connection(sock=sock, limit=1024)
    data = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n{headers}"
        f"Content-Length: {len(data)}\r\n\r\n"
    )
    writer.write(head.encode() + data)
    return reader, writer


def dechunk(body: bytes) -> bytes:
    """The payload of an HTTP/1.1 chunked body (an event may span chunks)."""
    payload, rest = bytearray(), body
    while True:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            return bytes(payload)
        payload += rest[:size]
        rest = rest[size + 2 :]


def sse_payloads(body: bytes) -> list[bytes]:
    """The data of each event of a raw chunked SSE response body (headers already read)."""
    return [e[6:] for e in dechunk(body).split(b"\n\n") if e.startswith(b"data: ")]


async def test_a_slow_reader_gets_everything_while_its_stream_stays_bounded(
    served: Client, engine: FakeEngine
) -> None:
    engine.tick_s = 0.0005
    engine.script = long_script(b"abcdefgh", TICKS)
    reader, writer = await open_stream(served.server.port, {"prompt": "Hi", "stream": True})
    received = bytearray()
    while not received.endswith(b"0\r\n\r\n"):  # the end of the chunked body
        received += await reader.read(256)
        await asyncio.sleep(0.01)  # 25 KB/s at most: slower than the stand-in engine writes
    writer.close()
    _, _, chunked = bytes(received).partition(b"\r\n\r\n")
    events = [json.loads(data) for data in sse_payloads(chunked)]
    text = "".join(e.get("text", "") for e in events)
    assert text == "abcdefgh" * (TICKS + 1)
    assert events[-1]["finish_reason"] == "length"
    assert events[-1]["usage"]["completion_tokens"] == TICKS + 1
    # The reader lagged: updates were merged (test_streams checks the stream stays bounded).
    assert len(events) < TICKS


async def test_a_stalled_reader_is_cancelled_and_others_are_not_slowed(
    served: Client, engine: FakeEngine
) -> None:
    engine.tick_s = 0.002
    engine.script = long_script(b"x" * 4096, 2000)
    reader, writer = await open_stream(served.server.port, {"prompt": "Hi", "stream": True})
    await until(lambda: len(engine.submits) == 1)
    # Another request is served in full while the stalled one still holds its stream.
    engine.script = long_script(b"ok", 3)
    other = await served.post("/generate", json={"prompt": "Hi"})
    assert (await other.json())["text"] == "ok" * 4
    await until(lambda: len(engine.cancels) == 1, timeout_s=20)
    [cancel] = engine.cancels
    assert cancel.request_id == engine.submits[0].request_id
    assert cancel.reason == protocol.FINISH_CLIENT_STALLED
    await until(lambda: served.app[CLIENT].in_flight == 0)
    # The server dropped the connection: the client reads what was sent, then EOF.
    while await reader.read(65536):
        pass
    writer.close()


async def test_a_stalled_reader_is_counted_as_stalled_even_after_the_engine_finished(
    served: Client, engine: FakeEngine
) -> None:
    engine.tick_s = 0.0005
    engine.script = long_script(b"x" * 4096, 200)  # 800 KB, all sent within a second
    before = await scrape(served)
    reader, writer = await open_stream(served.server.port, {"prompt": "Hi", "stream": True})
    requests = "tinyserve_requests_total"

    async def counted() -> bool:
        after = await scrape(served)
        return delta(before, after, requests, finish_reason="client_stalled", code="200") == 1

    await until(counted, timeout_s=20)
    assert not engine.cancels  # nothing to stop: the engine had finished it
    assert delta(before, await scrape(served), requests, finish_reason="rejected", code="200") == 0
    while await reader.read(65536):
        pass
    writer.close()
