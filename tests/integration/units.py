"""One engine and N frontends as separate processes, the way the systemd units run them.

Each process gets its own ``NOTIFY_SOCKET`` that the test listens on (as systemd does for a
``Type=notify`` unit), each frontend its own port, and all share one runtime dir. Unlike
``tinyserve serve``, nothing here stops the node when one process dies, so a test can kill
the engine and start a new one, as systemd's ``Restart=on-failure`` would.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from tests.integration.node import free_port, sse_events
from tinyserve_native.board import Board, EngineSnapshot, FrontendSlot

READY_TIMEOUT_S = 180.0


class Proc:
    """One ``tinyserve engine|frontend`` process and the notify socket it reports to."""

    def __init__(self, workdir: Path, name: str, argv: list[str], env: dict[str, str]) -> None:
        self.name = name
        self.argv = argv
        self.log_path = workdir / f"{name}.log"
        self._notify_path = str(workdir / f"{name}.notify")
        self._env = env
        self.messages: list[str] = []  # every sd_notify datagram received, in order
        self.process: subprocess.Popen[bytes] | None = None
        self._notify: socket.socket | None = None

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self) -> Proc:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._notify_path)
        self._notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._notify.bind(self._notify_path)
        self._notify.setblocking(False)
        self.messages = []
        env = {**os.environ, **self._env, "NOTIFY_SOCKET": self._notify_path}
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(self.argv, env=env, stdout=log, stderr=log)
        return self

    def poll_messages(self) -> list[str]:
        """Receive what arrived on the notify socket since the last call."""
        new: list[str] = []
        while self._notify is not None:
            try:
                new.append(self._notify.recv(4096).decode())
            except BlockingIOError:
                break
        self.messages += new
        return new

    def wait_for(self, line: str, timeout_s: float = READY_TIMEOUT_S) -> float:
        """Wait until a notify message holds ``line`` (e.g. ``READY=1``); returns when."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if any(line in m.split("\n") for m in self.poll_messages()):
                return time.monotonic()
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited early:\n{self.log()}")
            time.sleep(0.02)
        raise RuntimeError(f"{self.name}: no {line} in {timeout_s} s:\n{self.log()}")

    def kill9(self) -> float:
        """SIGKILL, and reap at once as systemd (PID 1) would; returns when it was sent."""
        assert self.process is not None
        sent = time.monotonic()
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()
        return sent

    def terminate(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)

    def wait(self, timeout_s: float = 60) -> int:
        assert self.process is not None
        return self.process.wait(timeout=timeout_s)

    def stop(self) -> int | None:
        """SIGTERM if still running; its exit status (None if it had to be killed)."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.terminate()
        try:
            code: int | None = self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            code = None
        if self._notify is not None:
            self.poll_messages()
            self._notify.close()
            self._notify = None
        return code

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except FileNotFoundError:
            return ""


@dataclass
class UnitNode:
    """An engine and ``frontends`` frontends on ports of their own, one runtime dir."""

    workdir: Path
    frontends: int = 2
    engine_flags: tuple[str, ...] = ()
    frontend_flags: tuple[str, ...] = ()
    # Flags for one frontend each, on top of frontend_flags: (flags of frontend 0, of 1, ...).
    each_frontend: tuple[tuple[str, ...], ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    engine: Proc = field(init=False)
    fronts: list[Proc] = field(init=False)
    ports: list[int] = field(init=False)

    def __post_init__(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.runtime_dir = self.workdir / "run"
        common = ["--runtime-dir", str(self.runtime_dir), "--log-level", "info"]
        python = [sys.executable, "-m", "tinyserve.cli"]
        # One llama.cpp thread: on a shared 2-core machine, two spinning threads slow down
        # tenfold whenever another process wants a core; these tests measure no speed.
        engine = [*python, "engine", *common, "--threads", "1", *self.engine_flags]
        self.engine = Proc(self.workdir, "engine", engine, self.env)
        self.ports = [free_port() for _ in range(self.frontends)]
        own = list(self.each_frontend) + [()] * self.frontends
        self.fronts = [
            Proc(
                self.workdir,
                f"frontend-{port}",
                [*python, "frontend", *common, "--port", str(port), *self.frontend_flags, *extra],
                self.env,
            )
            for port, extra in zip(self.ports, own, strict=False)
        ]

    @property
    def urls(self) -> list[str]:
        return [f"http://127.0.0.1:{port}" for port in self.ports]

    def start(self) -> UnitNode:
        # Engine first (the frontends' units are ordered after it), then all frontends at once.
        self.engine.start().wait_for("READY=1")
        for front in self.fronts:
            front.start()
        for front in self.fronts:
            front.wait_for("READY=1")
        return self

    def snapshot(self) -> EngineSnapshot:
        board = Board.attach(str(self.runtime_dir / "board"))
        try:
            return board.snapshot()
        finally:
            board.close()

    def frontend_slots(self) -> list[FrontendSlot]:
        board = Board.attach(str(self.runtime_dir / "board"))
        try:
            return board.frontend_slots()
        finally:
            board.close()

    def stop(self) -> dict[str, int | None]:
        """Frontends first, then the engine (systemd's stop order); every exit status."""
        codes = {front.name: front.stop() for front in self.fronts}
        codes["engine"] = self.engine.stop()
        return codes


@dataclass
class TimedStream:
    """What a client of one SSE request saw, with arrival times (``time.monotonic``)."""

    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    events: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    body: Any = None  # the JSON body of a non-200 reply
    ended_at: float = 0.0

    @property
    def final(self) -> dict[str, Any] | None:
        """The event that carries ``finish_reason``, if the stream got one."""
        finals = [e for _, e in self.events if "finish_reason" in e]
        return finals[-1] if finals else None

    @property
    def text(self) -> str:
        return "".join(e.get("text", "") for _, e in self.events)


async def timed_stream(
    session: aiohttp.ClientSession,
    url: str,
    body: dict[str, Any],
    seen: TimedStream | None = None,
) -> TimedStream:
    """POST a streaming /generate and record every event as it arrives (into ``seen``, which
    another task may watch while the stream runs)."""
    seen = seen if seen is not None else TimedStream()
    async with session.post(f"{url}/generate", json={**body, "stream": True}) as resp:
        seen.status, seen.headers = resp.status, dict(resp.headers)
        if resp.status != 200:
            seen.body = await resp.json(content_type=None)
        else:
            async for event in sse_events(resp):
                seen.events.append((time.monotonic(), event))
    seen.ended_at = time.monotonic()
    return seen


async def until(predicate: Callable[[], bool], timeout_s: float, what: str) -> float:
    """Poll ``predicate`` every 10 ms; returns when it held, fails after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)
    return time.monotonic()


async def get_json(session: aiohttp.ClientSession, url: str) -> tuple[int, dict[str, str], Any]:
    """GET: (status, headers, parsed JSON body)."""
    async with session.get(url) as resp:
        return resp.status, dict(resp.headers), await resp.json(content_type=None)


async def post_json(
    session: aiohttp.ClientSession, url: str, **body: Any
) -> tuple[int, dict[str, str], Any]:
    """POST /generate without streaming: (status, headers, parsed JSON body)."""
    async with session.post(f"{url}/generate", json=body) as resp:
        return resp.status, dict(resp.headers), json.loads(await resp.read() or b"null")
