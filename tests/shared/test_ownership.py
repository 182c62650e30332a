"""Claiming a runtime dir and a port before touching them: who is refused, and the message."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tinyserve.config import Config, build_config
from tinyserve.errors import TinyServeError
from tinyserve.options import ENGINE, FRONTEND
from tinyserve.ownership import claim_node, join_node
from tinyserve.rundir import LOCK_FILE
from tinyserve_native.board import Board


def config_for(runtime_dir: Path, port: int = 0) -> Config:
    return build_config({"runtime_dir": str(runtime_dir), "port": port}, environ={})


@pytest.fixture
def listener() -> Iterator[int]:
    """A port someone listens on (this process, as another node's frontend would)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def test_a_second_launcher_is_refused_by_the_lock(tmp_path: Path) -> None:
    first = claim_node(config_for(tmp_path))
    with pytest.raises(TinyServeError) as refused:
        claim_node(config_for(tmp_path))
    assert str(refused.value) == (
        f"runtime dir {tmp_path} is in use by tinyserve serve (pid {os.getpid()})"
    )
    first.release()
    claim_node(config_for(tmp_path)).release()


def test_standalone_processes_refuse_a_launchers_dir(tmp_path: Path) -> None:
    launcher = claim_node(config_for(tmp_path))  # our parent is not its holder: pytest is
    for role in (ENGINE, FRONTEND):
        with pytest.raises(TinyServeError, match=r"in use by tinyserve serve \(pid \d+\)"):
            join_node(config_for(tmp_path), role)
    launcher.release()


def test_a_launcher_refuses_a_dir_of_standalone_processes(tmp_path: Path) -> None:
    engine = join_node(config_for(tmp_path), ENGINE)
    assert engine is not None
    with pytest.raises(TinyServeError) as refused:
        claim_node(config_for(tmp_path))
    assert "a node started without tinyserve serve" in str(refused.value)
    assert str(os.getpid()) in str(refused.value)
    engine.release()


def test_a_live_engine_on_the_board_refuses_a_launcher_and_an_engine(tmp_path: Path) -> None:
    config = config_for(tmp_path)
    board = Board.create(config.board_path)
    board.set_identity(os.getpid(), time.monotonic_ns())
    try:
        for claim in (lambda: claim_node(config), lambda: join_node(config, ENGINE)):
            with pytest.raises(
                TinyServeError,
                match=f"another engine is serving from {config.board_path}, pid {os.getpid()} ",
            ):
                claim()
        # Refused before anything was left behind: the lock was let go again.
        assert join_node(config, FRONTEND) is not None
    finally:
        board.close()
        board.unlink()


def test_a_taken_port_refuses_a_launcher(tmp_path: Path, listener: int) -> None:
    with pytest.raises(TinyServeError) as refused:
        claim_node(config_for(tmp_path, listener))
    assert str(refused.value).startswith(
        f"port {listener} on 127.0.0.1 is already in use by pid {os.getpid()} ("
    )
    assert not (tmp_path / LOCK_FILE).exists()  # nothing of ours stays


def test_a_frontend_shares_a_port_only_with_its_own_node(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    # Another frontend of node "a", run as a systemd unit would: it holds a's lock, listens.
    other = subprocess.Popen(
        [sys.executable, "-c", FRONTEND_OF_A, str(tmp_path / "a")], stdout=subprocess.PIPE
    )
    try:
        assert other.stdout is not None
        port = int(other.stdout.readline())
        lock = join_node(config_for(tmp_path / "a", port), FRONTEND)
        assert lock is not None  # its own node: sharing the port is the plan
        lock.release()
        with pytest.raises(TinyServeError) as refused:
            join_node(config_for(tmp_path / "b", port), FRONTEND)
        assert f"port {port} on 127.0.0.1 is already in use by pid {other.pid} (" in str(
            refused.value
        )
    finally:
        other.kill()
        other.wait()


FRONTEND_OF_A = (
    "import socket, sys, time\n"
    "from tinyserve.rundir import NodeLock\n"
    "lock = NodeLock.try_take(sys.argv[1], exclusive=False)\n"
    "sock = socket.socket()\n"
    "sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)\n"
    "sock.bind(('127.0.0.1', 0))\n"
    "sock.listen()\n"
    "print(sock.getsockname()[1], flush=True)\n"
    "time.sleep(60)\n"
)
