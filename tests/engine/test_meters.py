"""engine/output/meters.py: metrics read from the tick report (structured grants and causes, no
string matching), and the scheduler-decision label stays bounded whatever tenants clients name."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tinyserve import metrics
from tinyserve.engine.output.meters import rule_label
from tinyserve.engine.output.report import RULE_ARRIVAL, RULE_PRIORITY, RULE_TENANT, Grant

TENANTS = frozenset({"a", "b"})


def grant(rule: str, tenant: str = "default", priority: int = 0) -> Grant:
    return Grant("r1", rule, tenant, priority, 0.0)


def test_rule_label_keeps_configured_tenants_and_bounded_rules() -> None:
    assert rule_label(grant(RULE_TENANT, "a"), TENANTS) == "tenant=a"
    assert rule_label(grant(RULE_TENANT, "someone-made-this-up-42"), TENANTS) == "tenant=other"
    assert rule_label(grant(RULE_PRIORITY, priority=3), TENANTS) == "priority=3"
    assert rule_label(grant(RULE_ARRIVAL), TENANTS) == "arrival"


# One engine process: meters two reports (a busy tick, then an idle pass) and exits.
METERED = """
import sys
from collections import Counter
from tinyserve import metrics, protocol as p
from tinyserve.engine.output.meters import EngineMeter
from tinyserve.engine.kv.host_cache import CacheStats
from tinyserve.engine.output.report import *
from tinyserve.engine.request.timeline import Timeline

m = metrics.setup(sys.argv[1], metrics.ENGINE)
meter = EngineMeter(m, "wfq", 4, ["a"])
def timeline(rid):
    return Timeline(p.Submit(rid, "f" * 32, [1] * 30, p.SamplingParams(), 8), "wfq")
def tokens(rid, n):
    return p.RequestUpdate(rid, 0, list(range(n)))
load = Load(tick=7, waiting=2, running=3, blocks_total=64, blocks_used=20, blocks_cached=5,
            drain_rate=1.5)
busy = TickReport(
    load,
    updates={"f" * 32: [tokens("r1", 1), tokens("r2", 1)]},
    grants=[Grant("r1", RULE_TENANT, "a", 0, 0.25), Grant("r2", RULE_TENANT, "zz", 0, 0.5)],
    finishes=[
        Ended(p.FINISH_CANCELLED, Cause.FRONTEND_GONE, 30, 16, timeline("r3")),
        Ended(p.FINISH_QUEUE_TIMEOUT, Cause.QUEUE_TIMEOUT, 30, 0, timeline("r4")),
        Ended(p.FINISH_CANCELLED, Cause.CLIENT, 30, 0, timeline("r5")),
    ],
    rejections=[Rejected(p.REJECT_QUEUE_FULL, timeline("r6"))],
    batch=Batch(requests=3, tokens=40, prefill_tokens=38, decode_tokens=2, decode_s=0.05),
    cache=CacheStats(2, 64, Counter(slot=16, host=32), Counter(short=1), stored_blocks=3,
                     restored_tokens=32, restore_ns=400_000, store_ns=100_000),
)
meter.after_pass(busy)
later = CacheStats(3, 96, Counter(slot=16, host=32, disk=16), Counter(short=1, no_match=2),
                   stored_blocks=5, evicted_blocks=2, restored_tokens=48, restore_ns=600_000,
                   store_ns=300_000, blocks_held=3, bytes_held=3000)
meter.after_pass(TickReport(Load(8, 0, 0, 64, 0, 5, 1.5), cache=later))
"""


def test_after_pass_meters_what_the_report_says(tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-c", METERED, str(tmp_path)], check=True, timeout=60)
    text = metrics.render(str(tmp_path / "metrics")).decode()
    found = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }

    def value(name: str, **labels: str) -> float:
        return found.get((name, tuple(sorted(labels.items()))), 0.0)

    decisions = "tinyserve_scheduler_decisions_total"
    assert value(decisions, policy="wfq", rule="tenant=a") == 1
    assert value(decisions, policy="wfq", rule="tenant=other") == 1
    assert value("tinyserve_queue_wait_seconds_sum") == 0.75  # the timelines' waits
    assert value("tinyserve_queue_wait_seconds_count") == 2
    assert value("tinyserve_cancellations_total", reason="frontend_gone") == 1
    assert value("tinyserve_cancellations_total", reason="queue_timeout") == 1
    assert value("tinyserve_admission_rejections_total", stage="engine", reason="queue_full") == 1
    assert value("tinyserve_prompt_tokens_total") == 90  # finishes, not rejections
    assert value("tinyserve_cached_prompt_tokens_total") == 16
    assert value("tinyserve_generation_tokens_total") == 2
    assert value("tinyserve_batch_tokens_sum") == 40
    # The cache's running totals, followed by their increments (not summed per report).
    cache = "tinyserve_prefix_cache"
    assert value(f"{cache}_lookups_total") == 3 and value(f"{cache}_lookup_tokens_total") == 96
    hits = {
        tier: value(f"{cache}_hit_tokens_total", tier=tier) for tier in ("slot", "host", "disk")
    }
    assert hits == {"slot": 16, "host": 32, "disk": 16}
    misses = {r: value(f"{cache}_misses_total", reason=r) for r in ("short", "no_match")}
    assert misses == {"short": 1, "no_match": 2}
    assert value(f"{cache}_stored_blocks_total") == 5
    assert value(f"{cache}_evicted_blocks_total") == 2
    assert abs(value(f"{cache}_restore_seconds_total") - 0.0006) < 1e-9
    assert abs(value(f"{cache}_store_seconds_total") - 0.0003) < 1e-9
    # The process has exited: its live gauges are gone, so no gauge is checked here.
