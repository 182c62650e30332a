"""``tinyserve frontend`` as a real process: READY=1 only after the handshake, clean SIGTERM."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
from pathlib import Path

import aiohttp

from tests.frontend.harness import FakeEngine, until
from tinyserve.config import Config


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def has_message(sock: socket.socket) -> bool:
    try:
        sock.recv(4096, socket.MSG_PEEK)
    except BlockingIOError:
        return False
    return True


async def next_message(sock: socket.socket, timeout_s: float) -> str:
    loop = asyncio.get_running_loop()
    return (await asyncio.wait_for(loop.sock_recv(sock, 4096), timeout_s)).decode()


async def status_of(session: aiohttp.ClientSession, url: str) -> int:
    try:
        async with session.get(url) as response:
            return response.status
    except aiohttp.ClientConnectionError:
        return 0  # not listening yet


async def test_ready_after_handshake_and_clean_stop(config: Config, tmp_path: Path) -> None:
    notify_path = str(tmp_path / "notify")
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(notify_path)
    notify.setblocking(False)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tinyserve.cli", "frontend",
        "--runtime-dir", config.runtime_dir, "--port", str(port), "--log-level", "warning",
        env={**os.environ, "NOTIFY_SOCKET": notify_path},
    )  # fmt: skip
    engine: FakeEngine | None = None
    try:
        async with aiohttp.ClientSession() as session:
            # Listening, but no engine: /health answers, /ready does not, no READY=1 yet.
            async def healthy() -> bool:
                return await status_of(session, base + "/health") == 200

            await until(healthy, 60, 0.1)
            assert await status_of(session, base + "/ready") == 503
            await asyncio.sleep(0.5)
            assert not has_message(notify)

            engine = FakeEngine(config).start()
            message = await next_message(notify, 10)
            assert "READY=1" in message and f"MAINPID={process.pid}" in message
            assert f"http://127.0.0.1:{port}" in message
            assert await status_of(session, base + "/ready") == 200
            assert len(engine.board.frontend_slots()) == 1

        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), 30) == 0
        assert "STOPPING=1" in await next_message(notify, 1)
        assert engine.board.frontend_slots() == []  # released on the way out
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        if engine is not None:
            await engine.stop()
        notify.close()


async def test_missing_model_fails_fast(tmp_path: Path) -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tinyserve.cli", "frontend", "--runtime-dir", str(tmp_path),
        "--port", str(free_port()), "--model", str(tmp_path / "absent.gguf"),
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, stderr = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 1
    assert b"absent.gguf" in stderr and b"Traceback" not in stderr
