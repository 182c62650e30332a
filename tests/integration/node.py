"""A real TinyServe node (``tinyserve serve``) in a subprocess, for integration tests."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp

READY_TIMEOUT_S = 180.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def children_of(pid: int) -> list[int]:
    """Direct children of ``pid`` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "Z" not in _state(pid)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"


class Node:
    """Starts ``tinyserve serve`` and waits for its READY=1; ``stop`` checks it left nothing."""

    def __init__(
        self, workdir: Path, *flags: str, frontends: int = 2, code: Path | None = None
    ) -> None:
        self.code = code  # a folder whose ``tinyserve`` package runs instead of this tree's
        self.runtime_dir = workdir / "run"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = workdir / "node.log"
        self._notify_path = str(workdir / "launcher.notify")
        self.argv = [
            sys.executable,
            "-m",
            "tinyserve.cli",
            "serve",
            "--runtime-dir",
            str(self.runtime_dir),
            "--port",
            str(self.port),
            "--frontends",
            str(frontends),
            # One llama.cpp thread unless a test asks otherwise: with two on this 2-core
            # machine, the test client and frontends preempting a spinning thread made
            # single requests up to 20x slower (measured), and timing-sensitive tests flaky.
            *(() if "--threads" in flags else ("--threads", "1")),
            # A slot's KV cells are allocated (and written) up front: 1024 each unless a test
            # asks otherwise, not the model's 4096, so that a node starts in about a second.
            *(() if "--ctx-per-slot" in flags else ("--ctx-per-slot", "1024")),
            *flags,
        ]
        self.process: subprocess.Popen[bytes] | None = None
        self._notify: socket.socket | None = None
        self.children: list[int] = []

    def start(self) -> Node:
        """Launch the node and wait for its READY=1."""
        return self.launch().wait_ready()

    def launch(self) -> Node:
        """Start ``tinyserve serve`` without waiting for anything (``wait_ready`` does)."""
        self._notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._notify.bind(self._notify_path)
        self._notify.settimeout(0.5)
        env = dict(os.environ, NOTIFY_SOCKET=self._notify_path)
        if self.code is not None:  # ``-m`` puts the working directory first on the path
            env["PYTHONPATH"] = str(self.code)
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                self.argv, env=env, stdout=log, stderr=log, cwd=self.code
            )
        return self

    def wait_ready(self) -> Node:
        """Wait for the launcher's READY=1 (every process of the node is ready)."""
        assert self.process is not None and self._notify is not None
        try:
            self._wait_ready(self._notify)
        finally:
            self._notify.close()
            os.unlink(self._notify_path)
            self._notify = None
        self.children = children_of(self.process.pid)
        return self

    def _wait_ready(self, notify: socket.socket) -> None:
        assert self.process is not None
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"node exited early:\n{self.log()}")
            try:
                if b"READY=1" in notify.recv(4096):
                    return
            except TimeoutError:
                continue
        raise RuntimeError(f"node not ready in time:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def engine_pid(self) -> int:
        from tinyserve_native.board import Board

        board = Board.attach(str(self.runtime_dir / "board"))
        try:
            return board.snapshot().pid
        finally:
            board.close()

    def stop(self, check: bool = True) -> int:
        """SIGTERM, wait, and (with ``check``) assert no process or file was left behind."""
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(timeout=90)
        if check:
            leftovers = [p for p in self.children if alive(p)]
            assert not leftovers, f"processes left behind: {leftovers}\n{self.log()}"
            files = sorted(p.name for p in self.runtime_dir.iterdir())
            assert not files, f"files left in the runtime dir: {files}"
        return code


async def generate(session: aiohttp.ClientSession, url: str, **body: Any) -> tuple[int, Any]:
    """POST /generate without streaming: (status, parsed JSON body)."""
    async with session.post(f"{url}/generate", json=body) as resp:
        return resp.status, await resp.json(content_type=None)


async def sse_events(resp: aiohttp.ClientResponse) -> AsyncIterator[dict[str, Any]]:
    """The JSON payloads of a server-sent event stream, in order."""
    buffer = b""
    async for chunk in resp.content.iter_any():
        buffer += chunk
        while b"\n\n" in buffer:
            event, buffer = buffer.split(b"\n\n", 1)
            for line in event.split(b"\n"):
                if line.startswith(b"data:"):
                    yield json.loads(line[5:].strip())


async def stream(session: aiohttp.ClientSession, url: str, **body: Any) -> list[dict[str, Any]]:
    """POST /generate with ``stream: true``; every event payload (raises on a non-200)."""
    async with session.post(f"{url}/generate", json={**body, "stream": True}) as resp:
        assert resp.status == 200, await resp.text()
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        return [event async for event in sse_events(resp)]
