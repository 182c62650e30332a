"""The runtime directory that holds the engine's ipc sockets and the board.

Whoever can write there can talk to the engine, so it must be ours and closed to others.
"""

from __future__ import annotations

import contextlib
import os
import stat

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
