"""Small process facts shared by the engine, the frontends and the launcher."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import signal
import socket
from collections.abc import Callable
from pathlib import Path

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
TCP_LISTEN = "0A"  # the state column of /proc/net/tcp
CMDLINE_SHOWN = 100  # characters of a command line quoted in a message


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (signal 0 checks without sending anything)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True


def parent_pid(pid: int) -> int:
    """The parent of ``pid`` (0 when it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    return int(stat.rsplit(")", 1)[1].split()[1])


def describe(pid: int) -> str:
    """``pid`` and its command line, for a message naming a process."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return f"pid {pid}"
    text = " ".join(arg.decode(errors="replace") for arg in argv if arg)
    if len(text) > CMDLINE_SHOWN:
        text = text[: CMDLINE_SHOWN - 1] + "…"
    return f"pid {pid} ({text})" if text else f"pid {pid}"


def die_with_parent(signum: int = signal.SIGTERM) -> Callable[[], None]:
    """A ``preexec_fn`` that has the kernel send ``signum`` to the child when its parent dies.

    ``PR_SET_PDEATHSIG`` survives ``exec`` and fires even when the parent is killed with
    SIGKILL. It is tied to the parent *thread* that forked the child, so only call Popen with
    it from a thread that lives as long as the parent (the launcher's main thread). A parent
    that died before ``prctl`` ran is caught by comparing ``getppid()``: the child then gives
    up before ``exec`` (Popen's child exits with status 255).
    """
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before the fork
    parent = os.getpid()

    def preexec() -> None:
        if prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
        if os.getppid() != parent:
            raise ChildProcessError("the parent died before the child started")

    return preexec


def port_in_use(host: str, port: int) -> bool:
    """Whether a socket listens where a frontend would bind ``host:port``.

    Binds a probe without SO_REUSEPORT (but with SO_REUSEADDR, as aiohttp does, so
    connections in TIME_WAIT do not count): the kernel refuses it exactly when a listener
    would otherwise share the port with us through SO_REUSEPORT.
    """
    if port == 0:
        return False  # an ephemeral port is never taken
    for family, kind, proto, _, address in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM):
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(address)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    return True
                raise
    return False


def port_listeners(port: int) -> list[int]:
    """Pids of the processes with a TCP socket listening on ``port`` (any address).

    Only processes whose ``/proc/PID/fd`` we may read are found: our own user's, which are
    the only ones SO_REUSEPORT would let us share a port with anyway.
    """
    inodes = _listening_inodes(port)
    if not inodes:
        return []
    return sorted(pid for pid in _all_pids() if inodes & _socket_inodes(pid))


def _listening_inodes(port: int) -> set[str]:
    found: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                cols = line.split()
                local_port = int(cols[1].rsplit(":", 1)[1], 16)
                if local_port == port and cols[3] == TCP_LISTEN:
                    found.add(cols[9])
    return found


def _all_pids() -> list[int]:
    return [int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit()]


def _socket_inodes(pid: int) -> set[str]:
    inodes: set[str] = set()
    with contextlib.suppress(OSError):
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes.add(target[len("socket:[") : -1])
    return inodes
