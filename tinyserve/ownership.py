"""Who owns a runtime dir and a port: checked before a process touches anything of a node.

A node is the engine and frontends that share one runtime dir. Starting a second one over a
live node must fail before it unlinks a socket, removes a metrics file or replaces the
board, so every entry point claims first and touches afterwards:

- ``tinyserve serve`` (``claim_node``): the exclusive ``RUN/lock`` (another launcher, or
  systemd-run processes holding it shared, refuse us), no live engine on the board, and
  nothing listening on ``--host:--port`` (SO_REUSEPORT would silently share it).
- ``tinyserve engine`` / ``frontend`` (``join_node``): the shared ``RUN/lock``, unless a
  launcher holds it and is our parent; the engine also needs the board free of a live
  engine, and a frontend a port that no process outside its own node listens on.

Each refusal is a ``TinyServeError`` naming the runtime dir or port and its owner.
"""

from __future__ import annotations

import os

from tinyserve.config import Config
from tinyserve.errors import TinyServeError
from tinyserve.options import ENGINE
from tinyserve.procs import describe, parent_pid, pid_alive, port_in_use, port_listeners
from tinyserve.rundir import NodeLock, lock_holders


def claim_node(config: Config) -> NodeLock:
    """The runtime dir and the port for a new node of ``tinyserve serve``, or refuse."""
    run = config.runtime_dir
    lock = NodeLock.try_take(run, exclusive=True)
    if lock is None:
        raise TinyServeError(f"runtime dir {run} is in use by {_lock_owner(run)}")
    try:
        _refuse_live_engine(config)
        _refuse_taken_port(config, members=set())
    except TinyServeError:
        lock.release()
        raise
    return lock


def join_node(config: Config, role: str) -> NodeLock | None:
    """Join (or start) the node of ``config.runtime_dir`` as one ``role`` process, or refuse.

    None when our parent is the launcher that owns the runtime dir: it holds the lock for
    its whole node.
    """
    run = config.runtime_dir
    lock = NodeLock.try_take(run, exclusive=False)
    if lock is None and not _launched_here(run):
        raise TinyServeError(f"runtime dir {run} is in use by {_lock_owner(run)}")
    try:
        if role == ENGINE:
            _refuse_live_engine(config)
        else:
            launcher = {os.getppid()} if lock is None else set()
            _refuse_taken_port(config, members=_node_members(run) | launcher)
    except TinyServeError:
        if lock is not None:
            lock.release()
        raise
    return lock


def live_engine_pid(board_path: str) -> int:
    """The pid of the live engine serving from ``board_path``, or 0."""
    # Imported here: the launcher needs the board only for this check (layering: the shared
    # package does not depend on the native one at import time).
    from tinyserve_native.board import Board, BoardError

    try:
        board = Board.attach(board_path)
    except BoardError:
        return 0
    try:
        pid = board.snapshot().pid
    except BoardError:
        return 0  # an engine died mid-write: the board is stale, not in use
    finally:
        board.close()
    return pid if pid_alive(pid) else 0


def _refuse_live_engine(config: Config) -> None:
    pid = live_engine_pid(config.board_path)
    if pid:
        raise TinyServeError(
            f"runtime dir {config.runtime_dir} is in use: another engine is serving from "
            f"{config.board_path}, {describe(pid)}"
        )


def _refuse_taken_port(config: Config, members: set[int]) -> None:
    try:
        if not port_in_use(config.host, config.port):
            return
    except OSError as exc:  # an address that is not ours, a name that does not resolve
        raise TinyServeError(f"cannot listen on {config.host}:{config.port}: {exc}") from exc
    listeners = port_listeners(config.port)
    if listeners and all(pid in members or parent_pid(pid) in members for pid in listeners):
        return  # our own node's frontends: sharing the port is the plan
    owner = ", ".join(describe(pid) for pid in listeners if pid not in members) or "unknown"
    raise TinyServeError(
        f"port {config.port} on {config.host} is already in use by {owner}; "
        "refusing to share it (SO_REUSEPORT would split its traffic between two nodes)"
    )


def _lock_owner(runtime_dir: str) -> str:
    holders = lock_holders(runtime_dir)
    if holders.exclusive or (holders.launcher and not holders.shared):
        pid = holders.exclusive[0] if holders.exclusive else holders.launcher
        return f"tinyserve serve (pid {pid})"
    pids = ", ".join(str(pid) for pid in holders.shared) or "unknown"
    return f"a node started without tinyserve serve (engine/frontends, pids {pids})"


def _launched_here(runtime_dir: str) -> bool:
    """Whether the launcher holding the runtime dir's lock is our parent."""
    # A shared lock is refused only while a launcher holds the exclusive one, and a launcher
    # writes its pid in the file as soon as it has it: the pid there is that launcher's.
    return os.getppid() == lock_holders(runtime_dir).launcher


def _node_members(runtime_dir: str) -> set[int]:
    """Pids of this runtime dir's node that hold its lock. A launcher's children hold none,
    so a listener whose parent is one of these is a member too (``_refuse_taken_port``)."""
    holders = lock_holders(runtime_dir)
    return {*holders.exclusive, *holders.shared} - {os.getpid()}
