"""Log lines under systemd: each carries its syslog priority for the journal, only there."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# What a process of ours logs right after start-up: one line per level, and a traceback.
SCRIPT = """
import logging, sys
from tinyserve.config import build_config
from tinyserve.logs import setup_logging
setup_logging(build_config({"log_format": sys.argv[1], "log_level": "debug"}, environ={}), "x")
log = logging.getLogger("t")
log.debug("fine detail")
log.info("hello")
log.warning("careful")
try:
    1 / 0
except ZeroDivisionError:
    log.exception("broke")
log.critical("gone")
"""


def run_logging(tmp_path: Path, log_format: str, journal: Path | None) -> list[str]:
    """The stderr lines of SCRIPT, with ``JOURNAL_STREAM`` naming ``journal``'s inode."""
    stderr = tmp_path / "stderr"
    env = {k: v for k, v in os.environ.items() if k != "JOURNAL_STREAM"}
    with stderr.open("w") as out:
        if journal is not None:
            stat = os.stat(journal)
            env["JOURNAL_STREAM"] = f"{stat.st_dev}:{stat.st_ino}"
        subprocess.run([sys.executable, "-c", SCRIPT, log_format], stderr=out, env=env, check=True)
    return stderr.read_text().splitlines()


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_on_the_journal_every_line_starts_with_its_syslog_priority(
    tmp_path: Path, log_format: str
) -> None:
    lines = run_logging(tmp_path, log_format, journal=tmp_path / "stderr")
    assert lines and all(line[0] == "<" and line[2] == ">" for line in lines), lines
    by_message = {
        message: next(line[:3] for line in lines if message in line)
        for message in ("fine detail", "hello", "careful", "broke", "gone")
    }
    assert by_message == {
        "fine detail": "<7>", "hello": "<6>", "careful": "<4>", "broke": "<3>", "gone": "<2>"
    }  # fmt: skip
    # The traceback's lines are entries of their own in the journal: each has the error's.
    traceback = [line for line in lines if "ZeroDivisionError" in line or "Traceback" in line]
    assert traceback and all(line.startswith("<3>") for line in traceback)
    if log_format == "json":
        assert [json.loads(line[3:])["level"] for line in lines] == [
            "debug", "info", "warning", "error", "critical"
        ]  # fmt: skip


def test_elsewhere_lines_have_no_prefix(tmp_path: Path) -> None:
    # Unset, or naming a stream that is not this stderr (a child whose stderr was
    # redirected inherits the variable): plain lines, as before.
    other = tmp_path / "other"
    other.write_text("")
    for journal in (None, other):
        lines = run_logging(tmp_path, "text", journal)
        assert lines and not any(line.startswith("<") for line in lines)
        assert any(" WARNING x t: careful" in line for line in lines)
