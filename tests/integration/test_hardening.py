"""Hardening on a real node: API keys off the command lines, the runtime dir and what is in
it closed to others, junk on the engine's socket, slow and stalled readers."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import msgpack
import pytest
import zmq

from tests.frontend.http.test_backpressure import open_stream, sse_payloads
from tests.shared.test_rundir import REFUSALS, unsafe_dir
from tinyserve import protocol
from tinyserve_native.board import Board

from .node import Node

pytestmark = pytest.mark.integration

KEYS = ("sk-hardening-1", "sk-hardening-2")
AUTH = {"Authorization": f"Bearer {KEYS[1]}"}
WRITE_TIMEOUT_S = 4
COUNTING = "1, 2, 3, 4, 5,"


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    flags = ["--slots", "2", "--ctx-per-slot", "2048", "--write-timeout", str(WRITE_TIMEOUT_S)]
    for key in KEYS:
        flags += ["--api-key", key]
    # Started under umask 0: whatever the node creates must still be closed to others.
    old = os.umask(0)
    try:
        running = Node(tmp_path_factory.mktemp("hardening"), *flags, frontends=1).start()
    finally:
        os.umask(old)
    yield running
    assert running.stop() == 0


def board_counts(node: Node) -> tuple[int, int]:
    board = Board.attach(str(node.runtime_dir / "board"))
    try:
        snap = board.snapshot()
        return snap.running, snap.waiting
    finally:
        board.close()


async def wait_for(condition: Any, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.1)


# -- keys and the runtime dir ---------------------------------------------------------------


def test_keys_stay_off_every_command_line(node: Node) -> None:
    for pid in node.children:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        assert not any(key.encode() in cmdline for key in KEYS), cmdline
    frontend = next(
        p for p in node.children if b"frontend" in Path(f"/proc/{p}/cmdline").read_bytes()
    )
    environ = Path(f"/proc/{frontend}/environ").read_bytes().split(b"\0")
    assert f"TINYSERVE_API_KEY={','.join(KEYS)}".encode() in environ


async def test_keys_are_required_on_the_real_node(node: Node) -> None:
    async with aiohttp.ClientSession() as session:
        body = {"prompt": COUNTING, "max_tokens": 2}
        async with session.post(f"{node.url}/generate", json=body) as resp:
            assert resp.status == 401 and resp.headers["WWW-Authenticate"] == "Bearer"
        async with session.post(f"{node.url}/generate", json=body, headers=AUTH) as resp:
            assert resp.status == 200
        async with session.get(f"{node.url}/ready") as resp:
            assert resp.status == 200


def test_runtime_dir_and_its_files_are_closed_to_others(node: Node) -> None:
    assert stat.S_IMODE(node.runtime_dir.stat().st_mode) == 0o700
    entries = {p.name: stat.S_IMODE(p.stat().st_mode) for p in node.runtime_dir.iterdir()}
    assert {"board", "engine.in", "engine.out"} <= set(entries)
    opened = {name: oct(mode) for name, mode in entries.items() if mode & 0o077}
    assert not opened, f"group/other access under umask 0: {opened}"


@pytest.mark.parametrize("role", ["engine", "frontend", "serve"])
@pytest.mark.parametrize("kind", REFUSALS)
def test_processes_refuse_an_unsafe_runtime_dir(tmp_path: Path, role: str, kind: str) -> None:
    path = unsafe_dir(tmp_path, kind)
    before = sorted(p.name for p in path.iterdir()) if path.is_dir() else None
    argv = [sys.executable, "-m", "tinyserve.cli", role, "--runtime-dir", str(path)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert REFUSALS[kind] in done.stderr and "failed to start" in done.stderr
    after = sorted(p.name for p in path.iterdir()) if path.is_dir() else None
    assert after == before  # no socket or board was created there


# -- malformed messages on the engine's socket ----------------------------------------------


def junk_frames(frontend_id: str) -> list[list[bytes]]:
    v = protocol.PROTOCOL_VERSION
    sampling = [0.0, 1.0, 0, None, [], 0.0, 0.0, -1, False]

    def submit(prompt: Any, max_tokens: Any, params: Any = sampling) -> bytes:
        fields = ["junk-" + os.urandom(4).hex(), frontend_id, prompt, params, max_tokens]
        return bytes(msgpack.packb([v, protocol.Submit.TAG, *fields]))

    return [
        [b"\x00\xff garbage"],
        [b"\x81\x80\x00"],  # a map keyed by a map: msgpack's TypeError
        [bytes(msgpack.packb([v + 1, protocol.Hello.TAG, frontend_id, 1]))],
        [bytes(msgpack.packb([v, 99, "x"]))],
        [bytes(msgpack.packb({"not": "a list"}))],
        [submit("1 2 3", 4)],
        [submit([1, 2], "4")],
        [submit([1, 2], 4, "greedy")],
        [submit([10**9], 4)],  # outside the vocabulary
        [submit([1, 2], -1)],
        [submit([1, 2], 4, [0.0, 1.0, 0, None, [], 0.0, 0.0, 10**6, False])],  # logprobs
        [protocol.encode(protocol.Cancel("unknown", frontend_id)), b"second frame"],
        [b"", b"", b""],
    ]


async def test_junk_on_the_engine_socket_is_dropped_and_it_keeps_serving(node: Node) -> None:
    engine_pid = node.engine_pid()
    ctx = zmq.Context()
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 1000)
    push.connect(f"ipc://{node.runtime_dir}/engine.in")
    try:
        for _ in range(100):
            for frames in junk_frames("f" * 32):
                push.send_multipart(frames)
    finally:
        push.close()
        ctx.term()
    async with aiohttp.ClientSession(headers=AUTH) as session:
        body = {"prompt": COUNTING, "max_tokens": 8, "ignore_eos": True}
        async with session.post(f"{node.url}/generate", json=body) as resp:
            reply = await resp.json()
    assert resp.status == 200 and reply["usage"]["completion_tokens"] == 8
    assert node.engine_pid() == engine_pid
    log = node.log()
    assert "dropped" in log and "Traceback" not in log
    # 1,300 junk messages, a handful of log lines.
    dropped = [line for line in log.splitlines() if "engine" in line and "dropped" in line]
    assert 1 <= len(dropped) <= 10, dropped


def test_a_malformed_submit_is_answered_with_an_error_finish(node: Node) -> None:
    """The engine does not run it, and whoever sent it gets its final update (not silence
    until a timeout): a finish of reason error that names the fault."""
    frontend_id = os.urandom(16).hex()
    ctx = zmq.Context()
    sub, push = ctx.socket(zmq.SUB), ctx.socket(zmq.PUSH)
    try:
        sub.setsockopt(zmq.SUBSCRIBE, protocol.topic(frontend_id))
        sub.connect(f"ipc://{node.runtime_dir}/engine.out")
        push.setsockopt(zmq.LINGER, 1000)
        push.connect(f"ipc://{node.runtime_dir}/engine.in")
        time.sleep(0.5)  # the subscription reaches the engine before the answer is sent
        sampling = protocol.SamplingParams(temperature=0.0)
        bad = protocol.Submit("malformed-1", frontend_id, [10**9], sampling, max_tokens=4)
        push.send(protocol.encode(bad))
        assert sub.poll(30_000), "no answer to a malformed submit"
        _, frame = sub.recv_multipart()
        out = protocol.decode(frame)
    finally:
        sub.close()
        push.close()
        ctx.term()
    assert isinstance(out, protocol.TickOutput)
    [update] = out.updates
    assert update.request_id == "malformed-1"
    assert update.finish_reason == protocol.FINISH_ERROR
    assert "outside the vocabulary" in update.detail


# -- slow and stalled readers -----------------------------------------------------------------


async def raw_stream(port: int, body: dict[str, Any]) -> tuple[Any, Any, dict[str, str]]:
    """A raw streaming request from a socket with a small receive buffer; returns the reader,
    the writer and the response headers."""
    auth = f"Authorization: {AUTH['Authorization']}\r\n"
    reader, writer = await open_stream(port, body, "/v1/completions", auth)
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    assert " 200 " in lines[0], head
    headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
    return reader, writer, headers


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


async def model_id(node: Node) -> str:
    async with (
        aiohttp.ClientSession(headers=AUTH) as session,
        session.get(f"{node.url}/v1/models") as resp,
    ):
        return str((await resp.json())["data"][0]["id"])


def completion(model: str, max_tokens: int) -> dict[str, Any]:
    # logprobs make every chunk large, so the socket buffers fill after a few hundred tokens.
    return {
        "model": model,
        "prompt": COUNTING,
        "max_tokens": max_tokens,
        "stream": True,
        "logprobs": 5,
        "ignore_eos": True,
    }


async def read_some(reader: Any, wanted: int) -> bytes:
    """Up to ``wanted`` bytes, taking what arrives within a short while."""
    got = bytearray()
    while len(got) < wanted:
        try:
            chunk = await asyncio.wait_for(reader.read(wanted - len(got)), 0.3)
        except TimeoutError:
            break
        if not chunk:
            break
        got += chunk
    return bytes(got)


async def test_a_slow_reader_gets_its_whole_stream_and_memory_stays_bounded(node: Node) -> None:
    tokens = 200
    reader, writer, headers = await raw_stream(node.port, completion(await model_id(node), tokens))
    frontend = int(headers["X-TinyServe-Frontend"])
    rss_start, rss_peak = rss_kib(frontend), 0
    body = bytearray()
    while not body.endswith(b"0\r\n\r\n"):  # the end of the chunked body
        await asyncio.sleep(0.5)  # at most 8 KB/s, slower than the node writes this stream
        body += await read_some(reader, 4 * 1024)
        rss_peak = max(rss_peak, rss_kib(frontend))
    writer.close()
    events = sse_payloads(bytes(body))
    assert events[-1] == b"[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    logprob_tokens = sum(len(c["choices"][0]["logprobs"]["tokens"]) for c in chunks[:-1])
    assert logprob_tokens == tokens and chunks[-1]["choices"][0]["finish_reason"] == "length"
    print(
        f"slow reader: {len(chunks)} chunks for {tokens} tokens, {len(body)} bytes; "
        f"frontend RSS {rss_start} KiB, peak {rss_peak} KiB"
    )
    assert rss_peak - rss_start < 32 * 1024


async def test_a_stalled_reader_is_cancelled_and_its_slot_freed(node: Node) -> None:
    _, writer, _ = await raw_stream(node.port, completion(await model_id(node), 1800))
    await wait_for(lambda: board_counts(node)[0] == 1, 60)
    # The client reads nothing more; the engine must free the slot well before 1,800 tokens.
    await wait_for(lambda: board_counts(node) == (0, 0), 120)
    assert "client stopped reading" in node.log()
    writer.close()
    async with (
        aiohttp.ClientSession(headers=AUTH) as session,
        session.get(f"{node.url}/metrics") as resp,
    ):
        metrics = await resp.text()
    stalled = [line for line in metrics.splitlines() if "client_stalled" in line]
    print("\n".join(stalled))
    assert stalled  # the cancel's reason reached the metrics
