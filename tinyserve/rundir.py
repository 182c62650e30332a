"""The runtime directory that holds the engine's ipc sockets and the board.

Whoever can write there can talk to the engine, so it must be ours and closed to others.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
from dataclasses import dataclass

from tinyserve.errors import TinyServeError


def prepare_runtime_dir(path: str) -> None:
    """Create ``path`` with mode 0700, or accept an existing one only if it is safe."""
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        info = os.stat(path)
    except FileExistsError:
        raise TinyServeError(f"runtime dir {path} is not a directory") from None
    except OSError as exc:
        raise TinyServeError(f"runtime dir {path}: {exc.strerror}") from exc
    if not stat.S_ISDIR(info.st_mode):
        raise TinyServeError(f"runtime dir {path} is not a directory")
    if info.st_uid != os.getuid():
        raise TinyServeError(f"runtime dir {path} is owned by uid {info.st_uid}, not us")
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise TinyServeError(
            f"runtime dir {path} is writable by others (mode {stat.S_IMODE(info.st_mode):o}); "
            "refusing to expose the engine's sockets there"
        )
    os.chmod(path, 0o700)


def remove_quietly(path: str) -> None:
    """Remove a file we created, if it is still there."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


LOCK_FILE = "lock"


@dataclass
class NodeLock:
    """A ``flock`` on ``RUN/lock``: who is using a runtime dir, held for a process's life.

    ``tinyserve serve`` holds it exclusively and writes its pid in the file; a standalone
    engine or frontend (the systemd units) holds it shared, so the processes of one
    systemd-run node coexist and a launcher sees them. The kernel drops a lock when its
    holder dies, even by SIGKILL, so a stale file never blocks anyone.
    """

    path: str
    fd: int
    exclusive: bool

    @classmethod
    def try_take(cls, runtime_dir: str, *, exclusive: bool) -> NodeLock | None:
        """Take the lock without waiting; None when a conflicting holder has it."""
        path = os.path.join(runtime_dir, LOCK_FILE)
        mode = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
            try:
                fcntl.flock(fd, mode | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                return None
            # a launcher removes the file while it still holds the lock (at exit); one
            # that we opened just before that is no longer the lock file: open the new one.
            if _same_file(fd, path):
                break
            os.close(fd)
        lock = cls(path, fd, exclusive)
        if exclusive:
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
        return lock

    def release(self) -> None:
        """Let go, removing the file when no one else holds it (the last one out).

        Removing it only while holding it exclusively is safe: whoever opened it meanwhile
        finds, once locked, that it is no longer the file at ``path`` (``try_take``).
        """
        with contextlib.suppress(BlockingIOError):
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if _same_file(self.fd, self.path):
                remove_quietly(self.path)
        os.close(self.fd)


@dataclass(frozen=True)
class LockHolders:
    """Who holds ``RUN/lock``: the launcher that wrote its pid, and every pid with a lock."""

    launcher: int  # the pid written in the file (0: none); a stale one may remain after a kill
    exclusive: tuple[int, ...]
    shared: tuple[int, ...]


def lock_holders(runtime_dir: str) -> LockHolders:
    """Read the holders of ``RUN/lock`` from ``/proc/locks`` and the pid in the file."""
    path = os.path.join(runtime_dir, LOCK_FILE)
    try:
        with open(path, "rb") as file:
            text = file.read(32).decode(errors="replace").strip()
        info = os.stat(path)
    except OSError:
        return LockHolders(0, (), ())
    exclusive: list[int] = []
    shared: list[int] = []
    for pid, kind in _flocks_on(info):
        (exclusive if kind == "WRITE" else shared).append(pid)
    return LockHolders(int(text) if text.isdigit() else 0, tuple(exclusive), tuple(shared))


def _flocks_on(info: os.stat_result) -> list[tuple[int, str]]:
    """(pid, READ|WRITE) of every granted flock on the file ``info`` describes."""
    device = f"{os.major(info.st_dev):02x}:{os.minor(info.st_dev):02x}:{info.st_ino}"
    found = []
    with contextlib.suppress(OSError), open("/proc/locks") as table:
        for line in table:
            cols = line.split()
            # Granted: "1: FLOCK ADVISORY WRITE pid maj:min:inode 0 EOF"; waiters have "->".
            if len(cols) >= 6 and cols[1] == "FLOCK" and cols[5] == device:
                found.append((int(cols[4]), cols[3]))
    return found


def _same_file(fd: int, path: str) -> bool:
    try:
        return os.fstat(fd).st_ino == os.stat(path, follow_symlinks=False).st_ino
    except FileNotFoundError:
        return False
