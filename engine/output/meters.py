"""The engine's Prometheus figures, all read from the tick's ``TickReport`` so the core stays
free of prometheus: the batch, slot grants (by policy and rule, with the timeline's queue
wait), finishes and rejections, generated tokens, the prefix cache's counters, and the gauges
from the report's one load snapshot, which comes on every pass of the loop, the idle one
included.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from tinyserve.engine.kv.host_cache import CacheStats
from tinyserve.engine.output.report import (
    RULE_PRIORITY,
    RULE_TENANT,
    Cause,
    Grant,
    Load,
    TickReport,
)
from tinyserve.metrics import Metrics
from tinyserve.protocol import FINISH_REJECTED

# Who ended a request, for the cancellations counter (the frontend counts the cancels it sends).
_CANCELLATIONS = {
    Cause.FRONTEND_GONE: "frontend_gone",
    Cause.REQUEST_TIMEOUT: "request_timeout",
    Cause.QUEUE_TIMEOUT: "queue_timeout",
    Cause.DEADLINE: "deadline_missed",
}
OTHER_TENANTS = "other"
# Gauges of the load, in the order _set_gauges lists their values.
_LOAD_GAUGES = (
    "requests_waiting",
    "requests_running",
    "kv_blocks_capacity",
    "kv_blocks_used",
    "kv_blocks_cached",
)


class EngineMeter:
    """Turns one engine's tick reports into metric updates; cheap per tick."""

    def __init__(
        self, metrics: Metrics, policy: str, slots: int, tenants: Iterable[str] = ()
    ) -> None:
        self.metrics = metrics
        self._policy = policy
        self._tenants = frozenset(tenants)  # named in --tenant-weights: their own rule label
        m = metrics
        self._gauges = [m.gauge(f"tinyserve_{name}") for name in _LOAD_GAUGES]
        m.gauge("tinyserve_slots").set(slots)
        self._queue_wait = m.histogram("tinyserve_queue_wait_seconds")
        self._decisions = m.counter("tinyserve_scheduler_decisions_total")
        self._rejections = m.counter("tinyserve_admission_rejections_total")
        self._cancellations = m.counter("tinyserve_cancellations_total")
        self._prompt = m.counter("tinyserve_prompt_tokens_total")
        self._cached = m.counter("tinyserve_cached_prompt_tokens_total")
        self._generated = m.counter("tinyserve_generation_tokens_total")
        self._batch_requests = m.histogram("tinyserve_batch_requests")
        self._batch_tokens = m.histogram("tinyserve_batch_tokens")
        self._decode = m.histogram("tinyserve_decode_step_seconds")
        self._spec_steps = m.counter("tinyserve_speculative_steps_total")
        self._spec_guessed = m.counter("tinyserve_speculative_guessed_tokens_total")
        self._spec_accepted = m.counter("tinyserve_speculative_accepted_tokens_total")
        self._embed_inputs = m.counter("tinyserve_embedding_inputs_total")
        self._embed_tokens = m.counter("tinyserve_embedding_tokens_total")
        self._embed_batch = m.histogram("tinyserve_embedding_batch_seconds")
        self._cache = _CacheCounters(metrics)
        self._last = (-1,) * len(_LOAD_GAUGES)  # gauge values written last

    def after_pass(self, report: TickReport) -> None:
        """After one pass of the engine loop, idle or not."""
        batch = report.batch
        if batch is not None:
            self._batch_requests.observe(batch.requests)
            self._batch_tokens.observe(batch.tokens)
            self._decode.observe(batch.decode_s)
        if report.generated:
            self._generated.inc(report.generated)
        if report.guessed.steps:
            self._spec_steps.inc(report.guessed.steps)
            self._spec_guessed.inc(report.guessed.tokens)
            self._spec_accepted.inc(report.guessed.accepted)
        if report.embed_batch is not None:
            self._embed_inputs.inc(report.embed_batch.inputs)
            self._embed_tokens.inc(report.embed_batch.tokens)
            self._embed_batch.observe(report.embed_batch.seconds)
        for embedded in report.embedded:
            if embedded.finish_reason == FINISH_REJECTED:
                self._rejections.labels("engine", embedded.detail).inc()
        for grant in report.grants:
            self._decisions.labels(self._policy, rule_label(grant, self._tenants)).inc()
            self._queue_wait.observe(grant.wait_s)
        for rejection in report.rejections:
            self._rejections.labels("engine", rejection.reason).inc()
        for finish in report.finishes:
            self._prompt.inc(finish.prompt_tokens)
            if finish.cached_tokens:
                self._cached.inc(finish.cached_tokens)
            if finish.cause in _CANCELLATIONS:
                self._cancellations.labels(_CANCELLATIONS[finish.cause]).inc()
        if report.cache is not None:
            self._cache.catch_up(report.cache)
        self._set_gauges(report.load)

    def _set_gauges(self, load: Load) -> None:
        values = (
            load.waiting,
            load.running,
            load.blocks_total,
            load.blocks_used,
            load.blocks_cached,
        )
        if values == self._last:
            return
        for gauge, value, last in zip(self._gauges, values, self._last, strict=True):
            if value != last:  # a write per change, not per pass
                gauge.set(value)
        self._last = values


def rule_label(grant: Grant, tenants: frozenset[str]) -> str:
    """The ``rule`` label of a slot grant: bounded, since clients name tenants, so tenants not
    configured in --tenant-weights share one label."""
    if grant.rule == RULE_TENANT:
        return f"tenant={grant.tenant if grant.tenant in tenants else OTHER_TENANTS}"
    if grant.rule == RULE_PRIORITY:
        return f"priority={grant.priority}"  # -10..10
    return grant.rule


class _CacheCounters:
    """Prometheus counters that follow ``CacheStats``' running totals by their increments."""

    def __init__(self, metrics: Metrics) -> None:
        m = metrics
        self._lookups = m.counter("tinyserve_prefix_cache_lookups_total")
        self._lookup_tokens = m.counter("tinyserve_prefix_cache_lookup_tokens_total")
        self._hit_tokens = m.counter("tinyserve_prefix_cache_hit_tokens_total")
        self._misses = m.counter("tinyserve_prefix_cache_misses_total")
        self._restore = m.counter("tinyserve_prefix_cache_restore_seconds_total")
        self._stored = m.counter("tinyserve_prefix_cache_stored_blocks_total")
        self._store = m.counter("tinyserve_prefix_cache_store_seconds_total")
        self._evicted = m.counter("tinyserve_prefix_cache_evicted_blocks_total")
        self._bytes = m.gauge("tinyserve_prefix_cache_bytes")
        self._seen = CacheStats()

    def catch_up(self, stats: CacheStats) -> None:
        seen = self._seen
        now = (stats.lookups, stats.stored_blocks, stats.bytes_held)
        if now == (seen.lookups, seen.stored_blocks, seen.bytes_held):
            return  # no grant looked anything up, nothing stored or read from disk since
        self._lookups.inc(stats.lookups - seen.lookups)
        self._lookup_tokens.inc(stats.lookup_tokens - seen.lookup_tokens)
        _follow(self._hit_tokens, stats.hit_tokens, seen.hit_tokens)
        _follow(self._misses, stats.misses, seen.misses)
        self._restore.inc((stats.restore_ns - seen.restore_ns) / 1e9)
        self._stored.inc(stats.stored_blocks - seen.stored_blocks)
        self._store.inc((stats.store_ns - seen.store_ns) / 1e9)
        self._evicted.inc(stats.evicted_blocks - seen.evicted_blocks)
        self._bytes.set(stats.bytes_held)
        self._seen = replace(
            stats, hit_tokens=Counter(stats.hit_tokens), misses=Counter(stats.misses)
        )


def _follow(counter: Any, totals: Counter[str], seen: Counter[str]) -> None:
    """Add each label's increment since ``seen`` to a labelled counter."""
    for label, total in totals.items():
        if total != seen[label]:
            counter.labels(label).inc(total - seen[label])
