"""The sd_notify protocol against a datagram socket this test listens on, as systemd does."""

from __future__ import annotations

import asyncio
import itertools
import os
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from tests.integration.units import UnitNode, timed_stream
from tinyserve import config
from tinyserve.sdnotify import Notifier

WATCHDOG_USEC = 1_000_000


@pytest.fixture
def listener(tmp_path: Path) -> Iterator[tuple[str, socket.socket]]:
    path = str(tmp_path / "notify")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(2)
    yield path, sock
    sock.close()


def test_each_message_is_one_datagram(listener: tuple[str, socket.socket]) -> None:
    path, sock = listener
    notifier = Notifier(path)
    assert notifier.enabled
    assert notifier.ready("serving on http://127.0.0.1:8001")
    assert sock.recv(4096).decode().split("\n") == [
        "READY=1",
        f"MAINPID={os.getpid()}",
        "STATUS=serving on http://127.0.0.1:8001",
    ]
    assert notifier.watchdog() and sock.recv(4096) == b"WATCHDOG=1"
    assert notifier.status("draining") and sock.recv(4096) == b"STATUS=draining"
    assert notifier.stopping() and sock.recv(4096) == b"STOPPING=1"
    notifier.close()
    assert not notifier.enabled and not notifier.watchdog()


def test_abstract_namespace_socket() -> None:
    # systemd may hand out "@name": a socket in the abstract namespace, no file.
    name = f"tinyserve-test-{uuid.uuid4().hex}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind("\0" + name)
    sock.settimeout(2)
    try:
        assert Notifier("@" + name).ready()
        assert sock.recv(4096).startswith(b"READY=1\n")
    finally:
        sock.close()


def test_without_a_socket_nothing_is_sent() -> None:
    notifier = Notifier(None)
    assert not notifier.enabled
    assert not notifier.ready() and not notifier.watchdog() and not notifier.stopping()


def test_nobody_listening_is_not_an_error(tmp_path: Path) -> None:
    assert not Notifier(str(tmp_path / "absent")).ready()


def test_a_listener_that_stops_reading_never_blocks_the_sender(
    listener: tuple[str, socket.socket],
) -> None:
    notifier = Notifier(listener[0])
    started = time.monotonic()
    sent = [notifier.watchdog() for _ in range(5000)]  # far more than a socket queues
    assert time.monotonic() - started < 1.0
    assert sent[0] and not sent[-1]


def test_watchdog_interval_is_half_the_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", "/run/systemd/notify")
    monkeypatch.setenv("WATCHDOG_USEC", "30000000")
    assert config.notify_socket() == "/run/systemd/notify"
    assert config.watchdog_interval_s() == 15.0
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    assert config.watchdog_interval_s() == 15.0
    monkeypatch.setenv("WATCHDOG_PID", str(os.getppid()))  # our parent's watchdog, not ours
    assert config.watchdog_interval_s() is None
    monkeypatch.delenv("WATCHDOG_PID")
    for unset in ("0", "", "soon"):
        monkeypatch.setenv("WATCHDOG_USEC", unset)
        assert config.watchdog_interval_s() is None
    monkeypatch.delenv("WATCHDOG_USEC")
    monkeypatch.delenv("NOTIFY_SOCKET")
    assert config.watchdog_interval_s() is None and config.notify_socket() is None


@pytest.mark.integration
async def test_engine_pings_the_watchdog_from_its_loop(tmp_path: Path) -> None:
    """A real engine with a 1 s watchdog: READY=1 with its pid once serving, a ping every
    ~0.5 s while idle and while decoding (never a gap systemd would kill it for), and
    STOPPING=1 on SIGTERM."""
    node = UnitNode(tmp_path, 1, env={"WATCHDOG_USEC": str(WATCHDOG_USEC)})
    pings: list[float] = []

    async def listen() -> None:
        # Read as systemd does, all the time: the socket's queue holds only a few messages.
        while True:
            pings.extend(time.monotonic() for m in node.engine.poll_messages() if m == "WATCHDOG=1")
            await asyncio.sleep(0.02)

    try:
        node.start()
        engine = node.engine
        assert f"MAINPID={engine.pid}" in engine.messages[-1].split("\n")
        listener = asyncio.create_task(listen())
        await asyncio.sleep(1.5)  # idle: the loop wakes from its socket poll to ping
        idle_pings = len(pings)
        async with aiohttp.ClientSession() as session:
            body = {"prompt": "1, 2, 3, 4, 5,", "max_tokens": 40}
            stream = await timed_stream(session, node.urls[0], body)
        listener.cancel()
    finally:
        codes = node.stop()
    assert codes == {node.fronts[0].name: 0, "engine": 0}
    assert idle_pings >= 2, engine.messages
    assert stream.final is not None and stream.final["finish_reason"] == "length"
    busy = [t for t in pings if stream.events[0][0] <= t <= stream.ended_at]
    gaps = [b - a for a, b in itertools.pairwise(pings)]
    assert len(busy) >= 1 and max(gaps) < WATCHDOG_USEC / 1e6, gaps
    assert "STOPPING=1" in engine.messages
