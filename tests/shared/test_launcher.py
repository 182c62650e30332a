"""``tinyserve serve``'s node readiness, without starting processes (tests/integration has the
real node)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from tinyserve.config import build_config
from tinyserve.launcher import Launcher


def launcher(tmp_path: Path, **options: object) -> Launcher:
    return Launcher(build_config({"runtime_dir": str(tmp_path), **options}, environ={}))


def test_frontends_sharing_the_port_each_wait_for_all_of_them(tmp_path: Path) -> None:
    node = launcher(tmp_path, frontends=3)
    for frontend in node.frontends:
        flags = frontend.argv[frontend.argv.index("frontend") + 1 :]
        assert flags[flags.index("--ready-frontends") + 1] == "3"
    assert "--ready-frontends" not in node.engine.argv


def test_ready_on_url_is_said_each_time_every_child_is_ready(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="tinyserve.launcher")
    node = launcher(tmp_path, frontends=2, host="::1", port=8123)
    said = "ready on http://[::1]:8123 (2 frontends"

    def announced() -> int:
        node.announce_when_whole()
        return sum(said in record.getMessage() for record in caplog.records)

    node.engine.ready = node.frontends[0].ready = True
    assert announced() == 0  # frontend 1 is not ready yet
    node.frontends[1].ready = True
    assert (announced(), announced()) == (1, 1)
    node.frontends[0].ready = False  # it died
    assert announced() == 1
    node.frontends[0].ready = True  # restarted and linked
    assert announced() == 2
