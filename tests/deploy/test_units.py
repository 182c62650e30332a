"""The systemd units in systemd/: what they promise, and ``systemd-analyze verify`` of each."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tinyserve.config import build_config
from tinyserve.options import OPTIONS

UNITS = Path(__file__).resolve().parents[2] / "systemd"
ENGINE = "tinyserve-engine.service"
FRONTEND = "tinyserve-frontend@.service"
TARGET = "tinyserve.target"
INSTALLED_BINARY = "/opt/tinyserve/venv/bin/tinyserve"
SYSTEMD_ANALYZE = shutil.which("systemd-analyze")
needs_analyze = pytest.mark.skipif(
    SYSTEMD_ANALYZE is None, reason="systemd-analyze not installed (make test installs it)"
)


def directives(name: str) -> dict[str, list[str]]:
    """``Section.Key`` -> every value it is given, in order (systemd keys may repeat)."""
    found: dict[str, list[str]] = {}
    section = ""
    for raw in (UNITS / name).read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        found.setdefault(f"{section}.{key.strip()}", []).append(value.strip())
    return found


def one(units: dict[str, list[str]], key: str) -> str:
    values = units[key]
    assert len(values) == 1, (key, values)
    return values[0]


def env_file() -> dict[str, str]:
    pairs = {}
    for line in (UNITS / "tinyserve.env").read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            pairs[key.strip()] = value.strip()
    return pairs


@pytest.mark.parametrize("name", [ENGINE, FRONTEND])
def test_services_are_notify_restarted_and_hardened(name: str) -> None:
    unit = directives(name)
    expected = {
        "Service.Type": "notify",
        "Service.Restart": "on-failure",
        "Service.User": "tinyserve",
        "Service.RuntimeDirectory": "tinyserve",
        "Service.RuntimeDirectoryMode": "0700",
        "Service.RuntimeDirectoryPreserve": "yes",
        "Service.ProtectSystem": "strict",
        "Service.NoNewPrivileges": "yes",
        "Service.PrivateTmp": "yes",
        "Service.CapabilityBoundingSet": "",
        "Service.AmbientCapabilities": "",
        "Service.EnvironmentFile": "-/etc/tinyserve/tinyserve.env",
        "Unit.PartOf": "tinyserve.target",
        "Install.WantedBy": "tinyserve.target",
    }
    assert {key: one(unit, key) for key in expected} == expected
    # The engine and the frontends must meet in the directory systemd creates.
    assert "--runtime-dir %t/tinyserve" in one(unit, "Service.ExecStart")


def test_engine_and_frontends_have_a_watchdog() -> None:
    for unit in (ENGINE, FRONTEND):
        assert int(one(directives(unit), "Service.WatchdogSec")) >= 10, unit


def test_frontends_start_after_the_engine_and_survive_its_restarts() -> None:
    unit = directives(FRONTEND)
    assert "tinyserve-engine.service" in one(unit, "Unit.After").split()
    assert one(unit, "Unit.Wants") == "tinyserve-engine.service"
    # Requires=/BindsTo= would stop or restart every frontend with the engine.
    assert "Unit.Requires" not in unit and "Unit.BindsTo" not in unit
    assert one(unit, "Service.ExecStart").endswith("--port %i")


def test_stop_timeout_outlasts_the_drain() -> None:
    drain = float(env_file()["TINYSERVE_DRAIN_TIMEOUT"])
    for name in (ENGINE, FRONTEND):
        assert int(one(directives(name), "Service.TimeoutStopSec")) > drain + 5


def test_env_file_names_only_real_settings() -> None:
    known = {opt.env for opt in OPTIONS}
    pairs = env_file()
    assert set(pairs) <= known, set(pairs) - known
    commented = set(re.findall(r"^#(TINYSERVE_\w+)=", (UNITS / "tinyserve.env").read_text(), re.M))
    assert commented <= known, commented - known
    resolved = build_config({"runtime_dir": "/run/tinyserve"}, environ=pairs)
    assert resolved.drain_timeout == float(pairs["TINYSERVE_DRAIN_TIMEOUT"])


def installable_copy(tmp_path: Path) -> list[str]:
    """The units with ExecStart pointing at this checkout's binary (verify checks that it
    exists) and the template instantiated once (a template alone cannot be loaded)."""
    binary = str(Path(sys.executable).parent / "tinyserve")
    for name in (ENGINE, FRONTEND, TARGET):
        text = (UNITS / name).read_text().replace(INSTALLED_BINARY, binary)
        (tmp_path / name).write_text(text)
    shutil.copy(tmp_path / FRONTEND, tmp_path / "tinyserve-frontend@8001.service")
    return [ENGINE, "tinyserve-frontend@8001.service", TARGET]


@needs_analyze
def test_systemd_analyze_verify(tmp_path: Path) -> None:
    assert SYSTEMD_ANALYZE is not None
    for name in installable_copy(tmp_path):
        run = subprocess.run(
            [SYSTEMD_ANALYZE, "verify", "--man=no", name],
            cwd=tmp_path,
            capture_output=True,
            text=True,
        )
        # verify exits 0 on unknown keys and bad values ("..., ignoring"): any output counts.
        assert run.returncode == 0 and not (run.stdout + run.stderr).strip(), (
            name,
            run.stdout + run.stderr,
        )


@needs_analyze
@pytest.mark.parametrize("name", [ENGINE, "tinyserve-frontend@8001.service"])
def test_exposure_is_low(tmp_path: Path, name: str) -> None:
    assert SYSTEMD_ANALYZE is not None
    installable_copy(tmp_path)
    run = subprocess.run(
        [SYSTEMD_ANALYZE, "security", "--offline=true", "--no-pager", name],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    match = re.search(r"Overall exposure level for \S+: ([\d.]+)", run.stdout)
    assert match, run.stdout + run.stderr
    assert float(match.group(1)) <= 2.0, run.stdout
