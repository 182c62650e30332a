"""tinyserve.metrics: the definitions, and the multiprocess merge with real processes."""

from __future__ import annotations

import stat
import subprocess
import sys
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tinyserve import metrics
from tinyserve.metrics import BATCH, ENGINE, FRONTEND, SECONDS, SPECS, TOKENS

# One process of a node: writes known values under argv[1], says so, waits for a line on stdin.
WRITER = """
import sys
from tinyserve import metrics
n, role = int(sys.argv[2]), sys.argv[3]
m = metrics.setup(sys.argv[1], role)
m.counter("tinyserve_admission_rejections_total").labels(role, "queue_full").inc(n)
if role == metrics.FRONTEND:
    m.counter("tinyserve_requests_total").labels("stop", "200").inc(n)
    m.gauge("tinyserve_frontend_requests_in_flight").set(n)
    m.gauge("tinyserve_engine_up").set(1)
    m.histogram("tinyserve_time_to_first_token_seconds").observe(0.02 * n)
else:
    m.gauge("tinyserve_kv_blocks_used").set(10 * n)
print("written", flush=True)
sys.stdin.readline()
"""


class Writer:
    """A process that wrote ``n`` into each of a few metrics and stays alive until ``stop``."""

    def __init__(self, runtime_dir: Path, n: int, role: str = FRONTEND) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(runtime_dir), str(n), role],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        assert self.process.stdout.readline().strip() == "written"
        self.pid = self.process.pid

    def stop(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write("\n")
        self.process.stdin.close()
        assert self.process.wait(timeout=30) == 0


def samples(directory: Path) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the merged exposition, by (name, sorted labels)."""
    text = metrics.render(str(directory)).decode()
    found = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            found[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return found


def value(found: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str):
    return found.get((name, tuple(sorted(labels.items()))))


def series(found: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str) -> list:
    return sorted(labels for (n, labels) in found if n == name)


# -- definitions ---------------------------------------------------------------------------


def test_names_are_prefixed_unique_and_follow_the_conventions() -> None:
    names = [spec.name for spec in SPECS]
    assert len(names) == len(set(names))
    for spec in SPECS:
        assert spec.name.startswith("tinyserve_"), spec.name
        assert spec.name.endswith("_total") == (spec.kind == "counter"), spec.name
        assert spec.writer in (ENGINE, FRONTEND, metrics.BOTH)
        assert spec.help


def test_histograms_have_buckets_for_what_they_measure() -> None:
    histograms = [spec for spec in SPECS if spec.kind == "histogram"]
    assert histograms
    for spec in histograms:
        if spec.name.endswith("_seconds"):
            assert spec.buckets == SECONDS, spec.name
        elif spec.name == "tinyserve_batch_requests":
            assert spec.buckets == BATCH
        else:
            assert "tokens" in spec.name and spec.buckets == TOKENS, spec.name
    assert (SECONDS[0], SECONDS[-1]) == (0.001, 600)
    for buckets in (SECONDS, TOKENS, BATCH):
        assert list(buckets) == sorted(set(buckets))
    assert TOKENS[0] == 1 and BATCH[0] == 1


def test_gauges_are_live_so_a_dead_process_drops_out() -> None:
    for spec in SPECS:
        if spec.kind == "gauge":
            assert spec.mode.startswith("live"), spec.name
            if spec.writer == ENGINE:
                assert spec.mode == "livemostrecent", spec.name  # one live engine
        else:
            assert spec.mode == ""


# -- several processes ---------------------------------------------------------------------


def test_processes_merge_into_one_view(tmp_path: Path) -> None:
    a, b = Writer(tmp_path, 2), Writer(tmp_path, 5)
    engine = Writer(tmp_path, 3, ENGINE)
    try:
        found = samples(tmp_path / "metrics")
        assert value(found, "tinyserve_requests_total", finish_reason="stop", code="200") == 7
        assert value(found, "tinyserve_frontend_requests_in_flight") == 7  # livesum
        # liveall: one series per frontend process (not the engine's), told apart by pid.
        pids = [str(a.pid), str(b.pid)]
        assert series(found, "tinyserve_engine_up") == sorted((("pid", p),) for p in pids)
        assert value(found, "tinyserve_kv_blocks_used") == 30  # the engine's, not a frontend 0
        rejections = "tinyserve_admission_rejections_total"
        assert value(found, rejections, stage=FRONTEND, reason="queue_full") == 7
        assert value(found, rejections, stage=ENGINE, reason="queue_full") == 3
        assert value(found, "tinyserve_time_to_first_token_seconds_count") == 2
        assert value(found, "tinyserve_time_to_first_token_seconds_bucket", le="0.05") == 1
        assert value(found, "tinyserve_time_to_first_token_seconds_bucket", le="0.1") == 2
    finally:
        for writer in (a, b, engine):
            writer.stop()


def test_dead_process_gauges_go_its_counters_stay(tmp_path: Path) -> None:
    directory = tmp_path / "metrics"
    a, b, engine = Writer(tmp_path, 2), Writer(tmp_path, 5), Writer(tmp_path, 3, ENGINE)
    b.stop()
    engine.stop()
    try:
        assert metrics.forget_dead(str(directory)) == sorted([b.pid, engine.pid])
        found = samples(directory)
        assert series(found, "tinyserve_engine_up") == [(("pid", str(a.pid)),)]
        assert value(found, "tinyserve_frontend_requests_in_flight") == 2
        assert value(found, "tinyserve_kv_blocks_used") is None  # no engine, no engine gauge
        assert value(found, "tinyserve_requests_total", finish_reason="stop", code="200") == 7
        assert metrics.forget_dead(str(directory)) == []
    finally:
        a.stop()


def test_an_earlier_runs_dead_processes_are_dropped_at_setup(tmp_path: Path) -> None:
    directory = tmp_path / "metrics"
    earlier = Writer(tmp_path, 3)
    earlier.stop()  # exits without anyone marking it dead: its gauge files stay behind
    assert any(str(earlier.pid) in p.name for p in directory.glob("gauge_live*"))
    later = Writer(tmp_path, 4)  # its setup() finds them
    try:
        assert not any(str(earlier.pid) in p.name for p in directory.glob("gauge_live*"))
        found = samples(directory)
        assert series(found, "tinyserve_engine_up") == [(("pid", str(later.pid)),)]
        assert value(found, "tinyserve_requests_total", finish_reason="stop", code="200") == 7
    finally:
        later.stop()


def test_one_process_may_play_both_roles(tmp_path: Path) -> None:
    # In-process tests run the engine loop and a frontend app together.
    script = (
        "import sys; from tinyserve import metrics\n"
        "e = metrics.setup(sys.argv[1], metrics.ENGINE)\n"
        "f = metrics.setup(sys.argv[1], metrics.FRONTEND)\n"
        "assert e is f\n"
        "e.gauge('tinyserve_kv_blocks_used').set(4)\n"
        "f.gauge('tinyserve_engine_up').set(1)\n"
        "e.counter('tinyserve_admission_rejections_total').labels('engine', 'x').inc()\n"
        "f.counter('tinyserve_admission_rejections_total').labels('frontend', 'x').inc()\n"
    )
    subprocess.run([sys.executable, "-c", script, str(tmp_path)], check=True)
    found = samples(tmp_path / "metrics")
    assert value(found, "tinyserve_kv_blocks_used") == 4
    rejections = "tinyserve_admission_rejections_total"
    assert value(found, rejections, stage=ENGINE, reason="x") == 1
    assert value(found, rejections, stage=FRONTEND, reason="x") == 1


def test_metrics_dir_is_private(tmp_path: Path) -> None:
    Writer(tmp_path, 1).stop()
    assert stat.S_IMODE((tmp_path / "metrics").stat().st_mode) == 0o700
    metrics.remove_metrics_dir(str(tmp_path))
    assert not (tmp_path / "metrics").exists()


def test_a_metrics_dir_open_to_others_is_refused(tmp_path: Path) -> None:
    (tmp_path / "metrics").mkdir(mode=0o777)
    (tmp_path / "metrics").chmod(0o777)
    result = subprocess.run(
        [sys.executable, "-c", WRITER, str(tmp_path), "1", FRONTEND],
        capture_output=True,
        text=True,
    )
    assert result.returncode != 0
    assert "writable by others" in result.stderr
