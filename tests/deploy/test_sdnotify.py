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

from tests.integration.units import TimedStream, UnitNode, timed_stream
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


def test_watchdog_interval_is_a_quarter_of_the_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", "/run/systemd/notify")
    monkeypatch.setenv("WATCHDOG_USEC", "30000000")
    assert config.notify_socket() == "/run/systemd/notify"
    assert config.watchdog_interval_s() == 7.5
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    assert config.watchdog_interval_s() == 7.5
    monkeypatch.setenv("WATCHDOG_PID", str(os.getppid()))  # our parent's watchdog, not ours
    assert config.watchdog_interval_s() is None
    monkeypatch.delenv("WATCHDOG_PID")
    for unset in ("0", "", "soon"):
        monkeypatch.setenv("WATCHDOG_USEC", unset)
        assert config.watchdog_interval_s() is None
    monkeypatch.delenv("WATCHDOG_USEC")
    monkeypatch.delenv("NOTIFY_SOCKET")
    assert config.watchdog_interval_s() is None and config.notify_socket() is None


POLL_S = 0.02
MAX_STREAMS = 100  # each takes at least a few decode steps: far more than 0.5 s in all


def busy_pings(pings: list[float], streams: list[TimedStream]) -> int:
    """Pings that came while one of ``streams`` was being decoded."""
    return sum(1 for t in pings for s in streams if s.events[0][0] <= t <= s.ended_at)


@pytest.mark.integration
async def test_engine_pings_the_watchdog_from_its_loop(tmp_path: Path) -> None:
    """A real engine with a 1 s watchdog: READY=1 with its pid once serving, a ping every
    ~0.25 s while idle and while decoding (never a gap systemd would kill it for), and
    STOPPING=1 on SIGTERM."""
    node = UnitNode(tmp_path, 1, env={"WATCHDOG_USEC": str(WATCHDOG_USEC)})
    pings: list[float] = []
    late = [0.0]  # the most this listener woke up after it meant to

    async def listen() -> None:
        # Read as systemd does, all the time: the socket's queue holds only a few messages.
        # A ping is timed when read: a listener that a loaded machine wakes late sees a gap
        # the engine did not make, so the bound below allows for its own lateness.
        while True:
            pings.extend(time.monotonic() for m in node.engine.poll_messages() if m == "WATCHDOG=1")
            due = time.monotonic() + POLL_S
            await asyncio.sleep(POLL_S)
            late[0] = max(late[0], time.monotonic() - due)

    try:
        node.start()
        engine = node.engine
        assert f"MAINPID={engine.pid}" in engine.messages[-1].split("\n")
        listener = asyncio.create_task(listen())
        await asyncio.sleep(1.5)  # idle: the loop wakes from its socket poll to ping
        idle_pings = len(pings)
        # Streams back to back until a ping lands inside one: how many that takes depends on
        # how fast this machine decodes just now (a 40-token stream may end between two pings).
        streams: list[TimedStream] = []
        async with aiohttp.ClientSession() as session:
            body = {"prompt": "1, 2, 3, 4, 5,", "max_tokens": 40}
            while len(streams) < MAX_STREAMS and not busy_pings(pings, streams):
                streams.append(await timed_stream(session, node.urls[0], body))
        listener.cancel()
    finally:
        codes = node.stop()
    assert codes == {node.fronts[0].name: 0, "engine": 0}
    assert idle_pings >= 2, engine.messages
    assert all(s.final is not None and s.final["finish_reason"] == "length" for s in streams)
    gaps = [b - a for a, b in itertools.pairwise(pings)]
    assert busy_pings(pings, streams) >= 1
    assert max(gaps) < WATCHDOG_USEC / 1e6 + late[0], (gaps, late[0])
    assert "STOPPING=1" in engine.messages
