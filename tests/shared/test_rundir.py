"""The runtime directory: created 0700, refused when someone else could use it."""

from __future__ import annotations

import fcntl
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tinyserve.errors import TinyServeError
from tinyserve.rundir import LOCK_FILE, NodeLock, lock_holders, prepare_runtime_dir


def unsafe_dir(tmp_path: Path, kind: str) -> Path:
    """A runtime dir that must be refused: ``group``/``other`` writable, ``owner`` another
    user's (needs root to make one), or ``file`` not a directory."""
    path = tmp_path / "run"
    if kind == "file":
        path.write_text("")
        return path
    path.mkdir(mode=0o700)
    if kind == "group":
        path.chmod(0o770)
    elif kind == "other":
        path.chmod(0o703)
    elif kind == "owner":
        if os.getuid() != 0:
            pytest.skip("making a directory owned by another user needs root")
        os.chown(path, 65534, 65534)
    return path


REFUSALS = {
    "group": "writable by others",
    "other": "writable by others",
    "owner": "owned by uid 65534",
    "file": "not a directory",
}


@pytest.mark.parametrize("kind", REFUSALS)
def test_unsafe_runtime_dir_is_refused(tmp_path: Path, kind: str) -> None:
    path = unsafe_dir(tmp_path, kind)
    with pytest.raises(TinyServeError, match=REFUSALS[kind]):
        prepare_runtime_dir(str(path))


def test_created_0700_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        prepare_runtime_dir(str(tmp_path / "a" / "run"))
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "a" / "run").stat().st_mode) == 0o700


def test_group_readable_dir_is_closed_down(tmp_path: Path) -> None:
    path = tmp_path / "run"
    path.mkdir(mode=0o750)
    path.chmod(0o750)
    prepare_runtime_dir(str(path))
    assert stat.S_IMODE(path.stat().st_mode) == 0o700


# -- the node lock ---------------------------------------------------------------------------


def test_exclusive_lock_excludes_everyone_and_names_its_holder(tmp_path: Path) -> None:
    first = NodeLock.try_take(str(tmp_path), exclusive=True)
    assert first is not None
    assert NodeLock.try_take(str(tmp_path), exclusive=True) is None
    assert NodeLock.try_take(str(tmp_path), exclusive=False) is None
    holders = lock_holders(str(tmp_path))
    assert (holders.launcher, holders.exclusive, holders.shared) == (
        os.getpid(),
        (os.getpid(),),
        (),
    )
    first.release()
    assert not (tmp_path / LOCK_FILE).exists()  # a launcher leaves nothing behind
    second = NodeLock.try_take(str(tmp_path), exclusive=True)
    assert second is not None
    second.release()


def test_shared_locks_coexist_and_keep_a_launcher_out(tmp_path: Path) -> None:
    engine = NodeLock.try_take(str(tmp_path), exclusive=False)
    frontend = NodeLock.try_take(str(tmp_path), exclusive=False)
    assert engine is not None and frontend is not None
    assert NodeLock.try_take(str(tmp_path), exclusive=True) is None
    holders = lock_holders(str(tmp_path))
    assert holders.shared == (os.getpid(), os.getpid()) and not holders.exclusive
    engine.release()
    assert (tmp_path / LOCK_FILE).exists()  # the frontend still holds it
    frontend.release()
    assert not (tmp_path / LOCK_FILE).exists()  # the last one out removed it
    launcher = NodeLock.try_take(str(tmp_path), exclusive=True)
    assert launcher is not None
    launcher.release()


def test_a_lock_file_removed_between_open_and_lock_is_not_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A launcher that exits (removing the file) between our open() and our flock(): we must
    # end up locking the new file, or two launchers could both think they own the dir.
    real_flock = fcntl.flock
    locked: list[int] = []

    def flock_after_removal(fd: int, operation: int) -> None:
        if not locked:
            os.unlink(tmp_path / LOCK_FILE)
        locked.append(fd)
        real_flock(fd, operation)

    monkeypatch.setattr(fcntl, "flock", flock_after_removal)
    lock = NodeLock.try_take(str(tmp_path), exclusive=True)
    assert lock is not None and len(locked) == 2
    assert os.fstat(lock.fd).st_ino == (tmp_path / LOCK_FILE).stat().st_ino
    lock.release()


def test_a_killed_holder_frees_the_lock(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
    assert NodeLock.try_take(str(tmp_path), exclusive=True) is None
    assert lock_holders(str(tmp_path)).exclusive == (holder.pid,)
    holder.kill()
    holder.wait()
    lock = NodeLock.try_take(str(tmp_path), exclusive=True)
    assert lock is not None  # the stale file, with the dead pid in it, blocks no one
    lock.release()


HOLD = (
    "import sys, time\n"
    "from tinyserve.rundir import NodeLock\n"
    "lock = NodeLock.try_take(sys.argv[1], exclusive=True)\n"
    "print('locked', flush=True)\n"
    "time.sleep(60)\n"
)
