"""The engine's Prometheus figures, taken around ``EngineCore.step`` so the core stays free of
prometheus: per-tick batch figures, what the tick's updates say (slots granted, tokens,
finishes), the prefix cache's counters, and the gauges, which are refreshed on every pass of
the loop, the idle one included.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from tinyserve import protocol
from tinyserve.engine.core import EngineCore
from tinyserve.engine.prefix_cache import CacheStats
from tinyserve.metrics import Metrics

# How the engine itself stops a request (the frontend counts the cancels it sends).
_CANCELLED_HERE = {
    protocol.FINISH_TIMEOUT: "request_timeout",
    protocol.FINISH_QUEUE_TIMEOUT: "queue_timeout",
}
_FRONTEND_GONE = "frontend gone"  # EngineCore.cancel_frontend's detail
TENANT_RULE = "tenant="  # WFQ's rule: the tenant whose turn it was
OTHER_TENANTS = "other"


class EngineMeter:
    """Turns one engine's state and tick outputs into metric updates; cheap per tick."""

    def __init__(self, metrics: Metrics, policy: str, tenants: Iterable[str] = ()) -> None:
        self.metrics = metrics
        self._policy = policy
        self._tenants = frozenset(tenants)  # named in --tenant-weights: their own rule label
        m = metrics
        self._gauges = {
            name: m.gauge(f"tinyserve_{name}")
            for name in (
                "requests_waiting",
                "requests_running",
                "slots",
                "kv_blocks_capacity",
                "kv_blocks_used",
                "kv_blocks_cached",
            )
        }
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
        self._cache = _CacheCounters(metrics)
        self._arrivals: dict[str, int] = {}  # request id -> arrival_ns, until its slot or end
        self._tick = 0
        self._last: dict[str, int] = {}  # gauge values written last

    def submitted(self, request: protocol.Submit) -> None:
        """Remember when a request was sent, for its queue wait (it may be granted a slot and
        finish within one tick, after which the core no longer knows it)."""
        self._arrivals[request.request_id] = request.arrival_ns

    def after_pass(
        self, core: EngineCore, outputs: list[protocol.TickOutput], step_ns: int
    ) -> None:
        """After one pass of the engine loop; ``step_ns`` is when its ``step`` began (slots
        are granted at its start)."""
        if core.tick != self._tick:  # a batch was decoded
            self._tick = core.tick
            stats = core.stats()
            self._batch_requests.observe(stats.batch_requests)
            self._batch_tokens.observe(stats.batch_tokens)
            self._decode.observe(stats.decode_s)
        generated = 0
        for out in outputs:
            for update in out.updates:
                generated += len(update.token_ids)
                if update.events or update.finish_reason is not None:
                    self._update(update, step_ns)
        if generated:
            self._generated.inc(generated)
        if core.cache is not None:
            self._cache.catch_up(core.cache.stats)
        self.set_gauges(core)

    def set_gauges(self, core: EngineCore) -> None:
        figures = {
            "requests_waiting": len(core.policy),
            "requests_running": len(core.running),
            "slots": len(core.slots),
            "kv_blocks_capacity": core.blocks.total,
            "kv_blocks_used": core.blocks.used,
            "kv_blocks_cached": core.blocks.cached,
        }
        for name, value in figures.items():
            if self._last.get(name) != value:  # a write per change, not per pass
                self._gauges[name].set(value)
                self._last[name] = value

    def _update(self, update: protocol.RequestUpdate, step_ns: int) -> None:
        for event in update.events:
            if event.kind == protocol.EVENT_SLOT:
                rule = rule_label(event.detail, self._tenants)
                self._decisions.labels(self._policy, rule).inc()
                arrival = self._arrivals.pop(update.request_id, 0)
                if arrival:
                    self._queue_wait.observe(max(step_ns - arrival, 0) / 1e9)
        if update.finish_reason is not None:
            self._finished(update)

    def _finished(self, update: protocol.RequestUpdate) -> None:
        self._arrivals.pop(update.request_id, None)
        reason = update.finish_reason
        if reason == protocol.FINISH_REJECTED:
            self._rejections.labels("engine", update.detail or "unknown").inc()
            return
        self._prompt.inc(update.prompt_tokens)
        if update.cached_tokens:
            self._cached.inc(update.cached_tokens)
        if reason == protocol.FINISH_CANCELLED and update.detail == _FRONTEND_GONE:
            self._cancellations.labels("frontend_gone").inc()
        elif reason in _CANCELLED_HERE:
            self._cancellations.labels(_CANCELLED_HERE[reason]).inc()


def rule_label(detail: str, tenants: frozenset[str]) -> str:
    """The ``rule`` label of a slot grant (its event's detail): bounded, since clients name
    tenants, so tenants not configured in --tenant-weights share one label."""
    tenant = detail.removeprefix(TENANT_RULE)
    if tenant != detail and tenant not in tenants:
        return TENANT_RULE + OTHER_TENANTS
    return detail or "next"


class _CacheCounters:
    """Prometheus counters that follow ``CacheStats``' running totals by their increments."""

    def __init__(self, metrics: Metrics) -> None:
        m = metrics
        self._lookups = m.counter("tinyserve_prefix_cache_lookups_total")
        self._lookup_tokens = m.counter("tinyserve_prefix_cache_lookup_tokens_total")
        self._hit_tokens = m.counter("tinyserve_prefix_cache_hit_tokens_total")
        self._misses = m.counter("tinyserve_prefix_cache_misses_total")
        self._evicted = m.counter("tinyserve_prefix_cache_evicted_blocks_total")
        self._seen = CacheStats()

    def catch_up(self, stats: CacheStats) -> None:
        seen = self._seen
        if stats.lookups == seen.lookups and stats.evicted_blocks == seen.evicted_blocks:
            return  # nothing looked up or evicted since the last pass
        self._lookups.inc(stats.lookups - seen.lookups)
        self._lookup_tokens.inc(stats.lookup_tokens - seen.lookup_tokens)
        self._hit_tokens.inc(stats.hit_tokens - seen.hit_tokens)
        self._evicted.inc(stats.evicted_blocks - seen.evicted_blocks)
        for reason, count in stats.misses.items():
            if count != seen.misses[reason]:
                self._misses.labels(reason).inc(count - seen.misses[reason])
        self._seen = CacheStats(
            stats.lookups,
            stats.lookup_tokens,
            stats.hit_tokens,
            Counter(stats.misses),
            stats.evicted_blocks,
        )
