"""What the Prometheus metrics cost: per engine loop pass, per request update, per scrape.

In one process, against a fresh metrics directory (multiprocess mode, as in a node):
- an idle engine pass (gauges only) and a busy one (a tick of 8 requests, one token each,
  with a slot grant and a finish), through ``EngineMeter.after_pass`` on a ``TickReport``;
- one output update of a request taken into its ``RequestRecord`` (``take``: a histogram
  observation);
- ``render()`` of the merged metrics, the work of one ``GET /metrics``.

    .venv/bin/python bench/metrics_overhead.py [--passes 20000]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable

from tinyserve import metrics, protocol
from tinyserve.engine.kv.host_cache import CacheStats
from tinyserve.engine.output.meters import EngineMeter
from tinyserve.engine.output.report import (
    RULE_ARRIVAL,
    Batch,
    Cause,
    Ended,
    Grant,
    Load,
    TickReport,
)
from tinyserve.engine.request.timeline import Timeline
from tinyserve.frontend.request.generation import Generation
from tinyserve.frontend.request.record import RequestRecord


def per_call_us(fn: Callable[[], None], n: int) -> float:
    started = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - started) / n * 1e6


def load(blocks_used: int = 40) -> Load:
    """A busy engine's load: 8 running requests, 2 waiting."""
    return Load(1, 2, 8, 256, blocks_used, 12, 1.0)


def busy_tick(n_requests: int) -> TickReport:
    """A tick of ``n_requests`` decode rows, one token each; one slot grant, one finish."""
    updates = [protocol.RequestUpdate(f"r{i}", 1, token_ids=[7]) for i in range(n_requests)]
    submit = protocol.Submit("r1", "f" * 32, [1] * 30, protocol.SamplingParams(), 8)
    finish = Ended(protocol.FINISH_LENGTH, Cause.NONE, 30, 0, Timeline(submit, "fifo"))
    return TickReport(
        load(),
        {"f" * 32: updates},
        grants=[Grant("r0", RULE_ARRIVAL, "default", 0, 0.01)],
        finishes=[finish],
        batch=Batch(n_requests, n_requests, 0, n_requests, 0.01),
        cache=CacheStats(),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--passes", type=int, default=20000)
    args = parser.parse_args()
    n = args.passes
    with tempfile.TemporaryDirectory() as run_dir:
        m = metrics.setup(run_dir, metrics.ENGINE)
        metrics.setup(run_dir, metrics.FRONTEND)
        meter = EngineMeter(m, "fifo", 8)
        idle_report = TickReport(load(), cache=CacheStats())
        idle = per_call_us(lambda: meter.after_pass(idle_report), n)

        report = busy_tick(8)
        changing = [load(40), load(41)]  # a gauge that changes, as in a busy engine
        tick = 0

        def busy() -> None:
            nonlocal tick
            tick += 1
            report.load = changing[tick % 2]
            meter.after_pass(report)

        busy_us = per_call_us(busy, n)
        generation = Generation("x", 1, protocol.SamplingParams())
        record = RequestRecord("/generate", generation, metrics.FrontendMetrics.of(m))
        update = protocol.RequestUpdate(record.request_id, 1, token_ids=[7], text=b"x")
        piece_us = per_call_us(lambda: record.take(update), n)
        scrape_ms = per_call_us(m.render, 200) / 1000
        size = len(m.render())
    print(f"engine pass, idle (gauges only):        {idle:7.1f} us")
    print(f"engine pass, tick of 8 requests:        {busy_us:7.1f} us")
    print(f"frontend, one output update:            {piece_us:7.1f} us")
    print(f"GET /metrics render (1 process's files): {scrape_ms:6.2f} ms, {size} bytes")


if __name__ == "__main__":
    main()
