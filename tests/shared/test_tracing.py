"""--trace-exporter: nothing when off, a clear start-up error when otlp is not installed."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from tinyserve.config import build_config
from tinyserve.errors import TinyServeError
from tinyserve.tracing import from_config, wall_offset_ns

OTLP_INSTALLED = (
    importlib.util.find_spec("opentelemetry.exporter.otlp.proto.http") is not None
    if importlib.util.find_spec("opentelemetry.exporter") is not None
    else False
)


def test_none_builds_no_provider() -> None:
    tracing = from_config(build_config({}, environ={}), "engine")
    assert tracing.tracer is None and tracing.provider is None
    tracing.shutdown()


def test_console_builds_a_tracer() -> None:
    tracing = from_config(build_config({"trace_exporter": "console"}, environ={}), "engine")
    assert tracing.tracer is not None
    tracing.shutdown()


@pytest.mark.skipif(OTLP_INSTALLED, reason="the OTLP exporter is installed here")
def test_otlp_without_the_package_is_a_clear_error() -> None:
    with pytest.raises(TinyServeError, match=r"tinyserve\[otlp\]"):
        from_config(build_config({"trace_exporter": "otlp"}, environ={}), "engine")


@pytest.mark.skipif(OTLP_INSTALLED, reason="the OTLP exporter is installed here")
@pytest.mark.parametrize("role", ["engine", "frontend"])
def test_a_process_asked_for_otlp_without_it_exits_at_start_up(role: str, tmp_path: Path) -> None:
    argv = [
        sys.executable,
        "-m",
        "tinyserve.cli",
        role,
        "--trace-exporter",
        "otlp",
        "--runtime-dir",
        str(tmp_path / "run"),
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert "needs the OTLP exporter package" in done.stderr


def test_the_wall_offset_comes_from_the_closest_pair_of_monotonic_reads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The first sample is preempted for 5 ms between its reads; the second is 2 us wide.
    monotonic = iter([1_000, 5_001_000, 10_000_000, 10_002_000])
    wall = iter([7_000_000_000, 7_010_001_000])
    monkeypatch.setattr("tinyserve.tracing.time.monotonic_ns", lambda: next(monotonic))
    monkeypatch.setattr("tinyserve.tracing.time.time_ns", lambda: next(wall))
    assert wall_offset_ns(samples=2) == 7_010_001_000 - 10_001_000
