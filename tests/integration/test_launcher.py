"""``tinyserve serve`` supervises its node: real launchers, engines and frontends, real model.

A dead engine or frontend is restarted and the node serves again; a crash loop, or a death
during the first start, stops the node; a killed launcher takes its node with it; a second
node over a live one's runtime dir or port refuses to start and leaves the first intact.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.integration.node import Node, alive, children_of, free_port, generate, sse_events
from tests.integration.units import until
from tinyserve.model import default_model_path

pytestmark = pytest.mark.integration

SMALL = ("--ctx-per-slot", "768")  # a small KV cache (LONG still fits): it starts faster
WATCHDOG_S = 3
LONG = {"prompt": "1, 2, 3, 4, 5,", "max_tokens": 500, "ignore_eos": True}
CLI = [sys.executable, "-m", "tinyserve.cli"]


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    watchdog = ("--watchdog-sec", str(WATCHDOG_S))
    running = Node(tmp_path_factory.mktemp("supervised"), *SMALL, *watchdog, frontends=1).start()
    yield running
    assert running.stop() == 0


def refusal(*argv: str) -> subprocess.Popen[str]:
    """Start a ``tinyserve`` command that should refuse to start (its log is on stderr)."""
    return subprocess.Popen(
        [*CLI, *argv], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def entries(directory: Path) -> dict[str, int]:
    """Name -> inode of what is in ``directory``: a replaced file shows as a new inode."""
    return {path.name: path.stat().st_ino for path in directory.iterdir()}


async def status_of(session: aiohttp.ClientSession, method: str, url: str, **kw: Any) -> int:
    try:
        async with session.request(method, url, **kw) as resp:
            await resp.read()
            return resp.status
    except (aiohttp.ClientConnectionError, TimeoutError):
        return 0


async def serving(session: aiohttp.ClientSession, url: str, timeout_s: float) -> float:
    """Wait until ``/generate`` answers 200; returns when."""
    deadline = time.monotonic() + timeout_s
    body = {"prompt": "Hi", "max_tokens": 2}
    while await status_of(session, "POST", f"{url}/generate", json=body) != 200:
        assert time.monotonic() < deadline, "the node did not serve again in time"
        await asyncio.sleep(0.05)
    return time.monotonic()


async def long_stream(session: aiohttp.ClientSession, url: str) -> AsyncIterator[dict[str, Any]]:
    async with session.post(f"{url}/generate", json={**LONG, "stream": True}) as resp:
        assert resp.status == 200
        async for event in sse_events(resp):
            yield event


def frontend_pids(node: Node) -> list[int]:
    assert node.process is not None
    return [pid for pid in children_of(node.process.pid) if pid != node.engine_pid()]


async def test_a_second_node_refuses_and_leaves_the_first_intact(
    node: Node, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert node.process is not None
    launcher, (frontend,) = node.process.pid, frontend_pids(node)
    before = entries(node.runtime_dir)
    run, port = str(node.runtime_dir), str(node.port)
    owned = f"runtime dir {run} is in use by tinyserve serve (pid {launcher})"
    port_taken = f"port {port} on 127.0.0.1 is already in use by pid {frontend} ("
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    expected = {
        # `make serve` twice: same runtime dir, same port.
        "node failed to start: " + owned: ("serve", "--runtime-dir", run, "--port", port),
        "node failed to start: " + port_taken: ("serve", "--runtime-dir", a, "--port", port),
        "engine failed to start: " + owned: ("engine", "--runtime-dir", run),
        "frontend failed to start: " + owned: (
            "frontend", "--runtime-dir", run, "--port", str(free_port()),
        ),
        "frontend failed to start: " + port_taken: ("frontend", "--runtime-dir", b, "--port", port),
    }  # fmt: skip
    started = time.monotonic()
    refusing = {line: refusal(*argv) for line, argv in expected.items()}
    for line, process in refusing.items():
        output, _ = process.communicate(timeout=60)
        assert process.returncode == 1, output
        assert line in output, output
    refused_in = time.monotonic() - started

    assert entries(node.runtime_dir) == before  # no socket, board or metrics file replaced
    async with aiohttp.ClientSession() as session:
        for method, path in (("GET", "/health"), ("GET", "/ready"), ("GET", "/metrics")):
            assert await status_of(session, method, node.url + path) == 200, path
        await serving(session, node.url, 5)
        async with session.get(node.url + "/metrics") as resp:
            text = await resp.text()
    # The frontend's and the engine's metric files are all still there.
    assert 'tinyserve_requests_total{code="200",finish_reason="length"}' in text
    assert "tinyserve_kv_blocks_capacity 384.0" in text  # 8 slots of 768 cells, 16 a block
    with capsys.disabled():
        print(f"\nfive refusals, run side by side, took {refused_in:.2f} s")


async def test_a_killed_engine_is_restarted_and_the_node_serves_again(
    node: Node, capsys: pytest.CaptureFixture[str]
) -> None:
    assert node.process is not None
    engine = node.engine_pid()
    async with aiohttp.ClientSession() as session:
        events = long_stream(session, node.url)
        await anext(events)
        killed = time.monotonic()
        os.kill(engine, signal.SIGKILL)
        rest = [event async for event in events]
        # The request in flight ends with an error at once, not when the engine is back.
        assert rest[-1]["finish_reason"] == "error", rest[-1]
        assert rest[-1]["error"]["reason"] == "engine_unavailable"
        failed = time.monotonic()
        # Until a new engine is ready: 503 engine_unavailable, not a hang or a 500.
        status, reply = await generate(session, node.url, prompt="Hi", max_tokens=2)
        assert (status, reply["error"]["reason"]) == (503, "engine_unavailable"), reply
        back = await serving(session, node.url, 30)
    assert node.process.poll() is None  # the same launcher
    assert node.engine_pid() not in (0, engine)
    log = node.log()
    assert f"engine (pid {engine}) killed by SIGKILL; restarting it in 0.5 s" in log
    assert f"engine restarted (pid {node.engine_pid()})" in log
    assert back - killed < 10
    with capsys.disabled():
        print(
            f"\nengine kill -9: in-flight error after {failed - killed:.2f} s, "
            f"serving again after {back - killed:.2f} s"
        )


async def test_a_killed_frontend_is_restarted(
    node: Node, capsys: pytest.CaptureFixture[str]
) -> None:
    (frontend,) = frontend_pids(node)
    killed = time.monotonic()
    os.kill(frontend, signal.SIGKILL)
    async with aiohttp.ClientSession() as session:
        back = await serving(session, node.url, 30)
        assert await status_of(session, "GET", node.url + "/ready") == 200
    (restarted,) = frontend_pids(node)
    assert restarted != frontend
    assert f"frontend 0 (pid {frontend}) killed by SIGKILL; restarting it in 0.5 s" in node.log()
    with capsys.disabled():
        print(f"\nfrontend kill -9: serving again after {back - killed:.2f} s")


@pytest.mark.parametrize("which", ["engine", "frontend 0"])
async def test_a_hung_process_is_killed_by_the_watchdog_and_restarted(
    node: Node, which: str, capsys: pytest.CaptureFixture[str]
) -> None:
    def pid() -> int:
        return node.engine_pid() if which == "engine" else frontend_pids(node)[0]

    hung = pid()
    stopped = time.monotonic()
    os.kill(hung, signal.SIGSTOP)  # it never takes the SIGABRT: the SIGKILL after the grace
    # A stopped frontend leaves connections waiting in its listen queue: short timeouts.
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as session:
        back = await serving(session, node.url, 60)
    assert pid() != hung
    log = node.log()
    said = f"{which} (pid {hung}) sent no watchdog ping for {WATCHDOG_S} s (--watchdog-sec)"
    assert said in log
    assert f"{which} (pid {hung}) killed by SIGKILL; restarting it" in log
    with capsys.disabled():
        print(f"\n{which} hung (SIGSTOP): serving again after {back - stopped:.2f} s")


async def test_a_killed_launcher_takes_its_node_with_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first = Node(tmp_path, *SMALL, "--drain-timeout", "2", frontends=1).start()
    assert first.process is not None
    members = children_of(first.process.pid)
    assert len(members) == 2
    async with aiohttp.ClientSession() as session:
        async with session.post(
            f"{first.url}/generate", json={**LONG, "max_tokens": 24, "stream": True}
        ) as resp:
            events = sse_events(resp)
            await anext(events)
            first.process.kill()  # SIGKILL: no chance to stop its children itself
            killed = time.monotonic()
            rest = [event async for event in events]
        # SIGTERM from the kernel drains the children: the request in flight finishes.
        assert rest[-1]["finish_reason"] == "length", rest[-1]
        gone = await until(lambda: not any(alive(pid) for pid in members), 2 + 5, "the node's end")
        assert await status_of(session, "GET", first.url + "/health") == 0  # nobody listens
    first.process.wait()
    log = first.log()
    # The next node starts over what the killed launcher left (its lock, notify sockets,
    # metrics) on the same runtime dir and port, and leaves nothing behind when it stops.
    second = Node(tmp_path, *SMALL, frontends=1)
    second.port, second.url = first.port, first.url
    second.argv[second.argv.index("--port") + 1] = str(first.port)
    assert second.start().stop() == 0
    assert "draining" in log
    with capsys.disabled():
        print(f"\nlauncher kill -9: its engine and frontend gone after {gone - killed:.2f} s")


def test_a_crash_loop_stops_the_node(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "model.gguf"
    model.symlink_to(default_model_path())
    node = Node(tmp_path, *SMALL, "--model", str(model), "--restart-limit", "1", frontends=1)
    node.start()
    assert node.process is not None
    engine, members = node.engine_pid(), children_of(node.process.pid)
    model.unlink()  # every new engine now fails to load the model
    started = time.monotonic()
    os.kill(engine, signal.SIGKILL)
    assert node.process.wait(timeout=60) == 1
    stopped = time.monotonic() - started
    log = node.log()
    assert f"engine (pid {engine}) killed by SIGKILL; restarting it in 0.5 s" in log
    assert "engine failed to start: model file not found" in log
    gave_up = "exited with status 1; it died 2 times within 120 s (--restart-limit 1); stopping"
    assert gave_up in log
    assert not [pid for pid in members if alive(pid)]
    with capsys.disabled():
        print(f"\ncrash loop: node stopped {stopped:.2f} s after the first kill")


def test_a_death_during_the_first_start_stops_the_node_at_once(tmp_path: Path) -> None:
    argv = [*CLI, "serve", "--runtime-dir", str(tmp_path / "run"), "--port", str(free_port())]
    done = subprocess.run(
        [*argv, "--model", str(tmp_path / "missing.gguf")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1, done.stderr
    assert "engine failed to start: model file not found" in done.stderr
    assert "node failed to start: engine (pid " in done.stderr
    assert "exited with status 1; stopping the node" in done.stderr
    assert "restarting" not in done.stderr
    assert list((tmp_path / "run").iterdir()) == []
