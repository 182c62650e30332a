"""Prometheus metrics of the whole node: every metric defined once, and the multiprocess plumbing.

Each process (the engine, every frontend) writes its values to files of its own under
``<runtime_dir>/metrics`` (prometheus-client's multiprocess mode); ``GET /metrics`` on any
frontend merges every process's files, so each frontend returns the node-wide view.

- Counters and histograms of a process that died keep counting toward the totals: its files
  stay and are merged (that is how multiprocess mode keeps totals monotonic). They are
  removed with the metrics directory: by ``tinyserve serve`` when the node stops, by systemd
  when the runtime directory goes.
- Gauges use ``live*`` modes, whose files are deleted when their process is marked dead
  (``forget_process``): the engine marks frontends it reaps, a frontend marks an engine it lost,
  and every process marks the dead pids it finds at start-up (an earlier run's leftovers).
- Engine gauges are ``livemostrecent`` (one live engine: its latest value); frontend gauges
  are ``liveall`` (one series per frontend, ``pid`` label) or ``livesum`` (node total).
"""

from __future__ import annotations

import dataclasses
import glob
import os
import shutil
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, values
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead

from tinyserve.options import ENGINE as ENGINE  # the process roles, which setup() takes
from tinyserve.options import FRONTEND as FRONTEND
from tinyserve.procs import pid_alive
from tinyserve.rundir import prepare_runtime_dir

METRICS_SUBDIR = "metrics"
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"  # what prometheus-client reads
CONTENT_TYPE = CONTENT_TYPE_LATEST

# Seconds, 1 ms .. 10 min: a decode step (ms) up to a long request under load (thousands of
# tokens while others share the batch), which would otherwise all land in +Inf.
SECONDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60,
           120, 300, 600)  # fmt: skip
# Token counts in powers of two: a request's prompt or output, a tick's batch (bounded by one
# slot's cells and --max-batch-tokens).
TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
# Requests in one batch: one per slot (--slots, 8 by default).
BATCH = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)

BOTH = f"{ENGINE}, {FRONTEND}"


@dataclass(frozen=True)
class Spec:
    """One metric: its exposed family name, what it means, and which process writes it."""

    name: str
    kind: str  # counter | gauge | histogram
    help: str
    writer: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] = ()
    mode: str = ""  # gauges: prometheus-client multiprocess_mode


def _counter(name: str, help_: str, writer: str, *labels: str) -> Spec:
    return Spec(name, "counter", help_, writer, labels)


def _gauge(name: str, help_: str, writer: str, mode: str, *labels: str) -> Spec:
    return Spec(name, "gauge", help_, writer, labels, mode=mode)


def _histogram(name: str, help_: str, writer: str, buckets: tuple[float, ...]) -> Spec:
    return Spec(name, "histogram", help_, writer, buckets=buckets)


_ENGINE_GAUGE = "livemostrecent"
SPECS: tuple[Spec, ...] = (
    _counter("tinyserve_http_responses_total", "HTTP responses of every route by route "
             "pattern and status, refusals before the pipeline included (499: client gone)",
             FRONTEND, "route", "code"),
    # -- requests (frontend: every request that passed input validation)
    _counter("tinyserve_requests_total", "Requests by how they ended: finish_reason and the "
             "HTTP status sent (499: client gone before any)", FRONTEND, "finish_reason", "code"),
    _counter("tinyserve_admission_rejections_total", "Requests turned away at admission, by "
             "stage (frontend board check, engine) and reason", BOTH, "stage", "reason"),
    _counter("tinyserve_constrained_requests_total", "Requests whose output a grammar "
             "constrains, by source (grammar, json_schema, json_object) and result (ok, or "
             "invalid: a 400 for a schema or grammar that cannot be built)", FRONTEND, "source",
             "result"),
    _counter("tinyserve_ignored_fields_total", "Request fields accepted and ignored (unknown, "
             "or asking for what this server does not do), by field path without list indices "
             "(docs/api.md, Accepted and ignored)", FRONTEND, "field"),
    _counter("tinyserve_cancellations_total", "Requests stopped before their end, by reason",
             BOTH, "reason"),
    _histogram("tinyserve_time_to_first_token_seconds", "Request arrival at the frontend to "
               "its first token there", FRONTEND, SECONDS),
    _histogram("tinyserve_inter_token_latency_seconds", "Gap between consecutive tokens of a "
               "request at the frontend", FRONTEND, SECONDS),
    _histogram("tinyserve_request_duration_seconds", "Request arrival to its reply's end",
               FRONTEND, SECONDS),
    _histogram("tinyserve_request_prompt_tokens", "Prompt tokens per finished request",
               FRONTEND, TOKENS),
    _histogram("tinyserve_request_generation_tokens", "Generated tokens per finished request",
               FRONTEND, TOKENS),
    _gauge("tinyserve_engine_up", "1 while this frontend sees a live engine heartbeat",
           FRONTEND, "liveall"),
    _gauge("tinyserve_frontend_requests_in_flight", "Requests with an open stream, all "
           "frontends", FRONTEND, "livesum"),
    # -- engine: queue, slots, KV
    _gauge("tinyserve_requests_waiting", "Accepted requests waiting for a slot", ENGINE,
           _ENGINE_GAUGE),
    _gauge("tinyserve_requests_running", "Requests holding a slot", ENGINE, _ENGINE_GAUGE),
    _gauge("tinyserve_slots", "Slots (sequences decoded together)", ENGINE, _ENGINE_GAUGE),
    _gauge("tinyserve_kv_blocks_capacity", "KV blocks of every slot's cells", ENGINE,
           _ENGINE_GAUGE),
    _gauge("tinyserve_kv_blocks_used", "KV blocks running requests fill", ENGINE,
           _ENGINE_GAUGE),
    _gauge("tinyserve_kv_blocks_cached", "KV blocks free slots keep of their last request",
           ENGINE, _ENGINE_GAUGE),
    _histogram("tinyserve_queue_wait_seconds", "Engine acceptance to slot granted",
               ENGINE, SECONDS),
    _counter("tinyserve_scheduler_decisions_total", "Slots granted, by policy and the policy's "
             "rule", ENGINE, "policy", "rule"),
    # -- engine: tokens, batches
    _counter("tinyserve_prompt_tokens_total", "Prompt tokens of requests the engine finished",
             ENGINE),
    _counter("tinyserve_cached_prompt_tokens_total", "Prompt tokens served from the prefix "
             "cache", ENGINE),
    _counter("tinyserve_generation_tokens_total", "Tokens generated", ENGINE),
    _histogram("tinyserve_batch_requests", "Requests in one tick's batch", ENGINE, BATCH),
    _histogram("tinyserve_batch_tokens", "Tokens in one tick's batch", ENGINE, TOKENS),
    _histogram("tinyserve_decode_step_seconds", "Duration of one llama_decode call", ENGINE,
               SECONDS),
    # -- engine: embeddings (/v1/embeddings)
    _counter("tinyserve_embedding_inputs_total", "Inputs embedded", ENGINE),
    _counter("tinyserve_embedding_tokens_total", "Tokens of the inputs embedded", ENGINE),
    _histogram("tinyserve_embedding_batch_seconds", "Duration of one embedding batch (at most "
               "--embedding-max-tokens tokens, run between two generation ticks)", ENGINE,
               SECONDS),
    _counter("tinyserve_speculative_steps_total", "Decode rows that carried guessed tokens "
             "(prompt lookup, --speculate)", ENGINE),
    _counter("tinyserve_speculative_guessed_tokens_total", "Tokens guessed", ENGINE),
    _counter("tinyserve_speculative_accepted_tokens_total", "Guessed tokens the model agreed "
             "with: each one a token generated without a step of its own", ENGINE),
    # -- engine: prefix cache
    _counter("tinyserve_prefix_cache_lookups_total", "Slot grants that looked for a prompt's "
             "start in a slot's kept cells and the prefix cache", ENGINE),
    _counter("tinyserve_prefix_cache_lookup_tokens_total", "Prompt tokens looked up (all "
             "but the last, whose logits are needed)", ENGINE),
    _counter("tinyserve_prefix_cache_hit_tokens_total", "Prompt tokens reused, by where they "
             "were: a slot's kept cells, host memory, blocks read from disk", ENGINE, "tier"),
    _counter("tinyserve_prefix_cache_misses_total", "Slot grants that reused nothing, by "
             "reason", ENGINE, "reason"),
    _counter("tinyserve_prefix_cache_restore_seconds_total", "Time spent writing cached "
             "blocks into slots", ENGINE),
    _counter("tinyserve_prefix_cache_stored_blocks_total", "Blocks of finished requests put "
             "in the prefix cache", ENGINE),
    _counter("tinyserve_prefix_cache_store_seconds_total", "Time spent copying finished "
             "requests' blocks into the prefix cache", ENGINE),
    _counter("tinyserve_prefix_cache_evicted_blocks_total", "Blocks the prefix cache let go "
             "to make room", ENGINE),
    _gauge("tinyserve_prefix_cache_bytes", "Bytes of KV the prefix cache holds in host "
           "memory (at most --host-cache-mb)", ENGINE, _ENGINE_GAUGE),
)  # fmt: skip


def _make(spec: Spec) -> Counter | Gauge | Histogram:
    # registry=None: in multiprocess mode values live in files; render() collects from those.
    if spec.kind == "counter":
        return Counter(spec.name, spec.help, spec.labels, registry=None)
    if spec.kind == "gauge":
        return Gauge(
            spec.name, spec.help, spec.labels, registry=None,
            multiprocess_mode=spec.mode,  # type: ignore[arg-type]
        )  # fmt: skip
    return Histogram(spec.name, spec.help, spec.labels, registry=None, buckets=spec.buckets)


class Metrics:
    """This process's metric objects, writing under ``directory``. Get it from ``setup``.

    Only the metrics of the roles the process plays exist: a metric without labels writes its
    zero on creation, and a frontend's zero engine gauges (or the engine's zero
    ``engine_up``) would show. A test may play both roles in one process.
    """

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self._by_name: dict[str, Counter | Gauge | Histogram] = {}

    def add_role(self, role: str) -> None:
        """Create the metrics a process of kind ``role`` writes (those not created yet)."""
        for spec in SPECS:
            if role in spec.writer and spec.name not in self._by_name:
                self._by_name[spec.name] = _make(spec)

    def metric(self, name: str) -> Counter | Gauge | Histogram:
        return self._by_name[name]

    def counter(self, name: str) -> Counter:
        metric = self._by_name[name]
        assert isinstance(metric, Counter), name
        return metric

    def gauge(self, name: str) -> Gauge:
        metric = self._by_name[name]
        assert isinstance(metric, Gauge), name
        return metric

    def histogram(self, name: str) -> Histogram:
        metric = self._by_name[name]
        assert isinstance(metric, Histogram), name
        return metric

    def render(self) -> bytes:
        """Every process's metrics, merged, in the text exposition format."""
        return render(self.directory)

    def forget_process(self, pid: int) -> None:
        """``pid`` is dead: drop its live gauges (its counters keep counting toward totals)."""
        mark_process_dead(pid, self.directory)  # type: ignore[no-untyped-call]


@dataclass(frozen=True)
class FrontendMetrics:
    """What a frontend writes, as objects: each field is the metric named ``tinyserve_`` +
    the field's name, looked up once here, so a site writes through an attribute and a
    misspelt name fails at start-up, not on the request that reaches it."""

    process: Metrics  # the process's files: rendering, forgetting a dead process
    http_responses_total: Counter
    requests_total: Counter
    admission_rejections_total: Counter
    constrained_requests_total: Counter
    ignored_fields_total: Counter
    cancellations_total: Counter
    time_to_first_token_seconds: Histogram
    inter_token_latency_seconds: Histogram
    request_duration_seconds: Histogram
    request_prompt_tokens: Histogram
    request_generation_tokens: Histogram
    engine_up: Gauge
    frontend_requests_in_flight: Gauge

    @classmethod
    def of(cls, process: Metrics) -> FrontendMetrics:
        """The frontend metrics of ``process`` (``setup(..., FRONTEND)`` created them)."""
        found: dict[str, Any] = {"process": process}
        for field in dataclasses.fields(cls)[1:]:
            metric = process.metric(f"tinyserve_{field.name}")
            assert type(metric).__name__ == field.type, (field.name, field.type)
            found[field.name] = metric
        return cls(**found)


# one per process. prometheus-client keeps one file per process and metric type and
# caches its open files; a second set of metric objects would overwrite the first one's values.
_process_metrics: Metrics | None = None


def setup(runtime_dir: str, role: str) -> Metrics:
    """This process's metrics (``role``: ENGINE or FRONTEND), writing under
    ``<runtime_dir>/metrics`` (created 0700).

    Call it early in each process entry point, before any other code touches a metric. Later
    calls return the same object, whatever ``runtime_dir`` (tests that build several apps in
    one process share the first directory), with ``role``'s metrics added.
    """
    global _process_metrics
    if _process_metrics is None:
        _process_metrics = Metrics(_prepare(runtime_dir))
    _process_metrics.add_role(role)
    return _process_metrics


def _prepare(runtime_dir: str) -> str:
    """Create the metrics directory and point prometheus-client at it; returns its path."""
    directory = os.path.join(runtime_dir, METRICS_SUBDIR)
    prepare_runtime_dir(runtime_dir)
    prepare_runtime_dir(directory)
    # the one environment write of the project: prometheus-client reads this variable to
    # choose per-process files, and picks its value class when it is first imported, which in
    # our processes happens before the runtime dir is known; so choose it again now.
    os.environ[MULTIPROC_ENV] = directory
    if not getattr(values.ValueClass, "_multiprocess", False):
        values.ValueClass = values.get_value_class()  # type: ignore[no-untyped-call]
    forget_dead(directory)
    # A dead process of an earlier run may have had our pid: its live gauges are not ours.
    for path in glob.glob(os.path.join(directory, f"gauge_*_{os.getpid()}.db")):
        os.unlink(path)
    return directory


def forget_dead(directory: str) -> list[int]:
    """Mark every process with live gauge files under ``directory`` that no longer runs as
    dead; returns their pids."""
    dead = sorted({pid for pid in _gauge_pids(directory) if not pid_alive(pid)})
    for pid in dead:
        mark_process_dead(pid, directory)  # type: ignore[no-untyped-call]
    return dead


def _gauge_pids(directory: str) -> list[int]:
    pids = []
    for path in glob.glob(os.path.join(directory, "gauge_live*_*.db")):
        stem = os.path.basename(path)[: -len(".db")]
        pid = stem.rsplit("_", 1)[1]
        if pid.isdigit():
            pids.append(int(pid))
    return pids


def render(directory: str) -> bytes:
    """The merged metrics of every process that wrote under ``directory``."""
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=directory)  # type: ignore[no-untyped-call]
    return generate_latest(registry)


def remove_metrics_dir(runtime_dir: str) -> None:
    """Remove a node's metrics files (counters restart from zero with the node).

    Only for a runtime dir the caller owns (``tinyserve serve`` holding ``RUN/lock``
    exclusively, see ``tinyserve.ownership``): a live node's processes keep their files open
    and render ``/metrics`` from them, and a frontend whose files vanish answers 500."""
    shutil.rmtree(os.path.join(runtime_dir, METRICS_SUBDIR), ignore_errors=True)
