"""The runtime directory: created 0700, refused when someone else could use it."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from tinyserve.errors import TinyServeError
from tinyserve.rundir import prepare_runtime_dir


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
