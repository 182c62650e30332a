"""What the Prometheus metrics cost: per engine loop pass, per request piece, per scrape.

In one process, against a fresh metrics directory (multiprocess mode, as in a node):
- an idle engine pass (gauges only) and a busy one (a tick of 8 requests, one token each,
  with a slot grant and a finish), through ``EngineMeter.after_pass`` on a stand-in core;
- one output piece of a request through ``RequestMeter.piece`` (a histogram observation);
- ``render()`` of the merged metrics, the work of one ``GET /metrics``.

    .venv/bin/python bench/metrics_overhead.py [--passes 20000]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from tinyserve import metrics, protocol
from tinyserve.engine.meters import EngineMeter
from tinyserve.engine.prefix_cache import CacheStats
from tinyserve.frontend.meters import RequestMeter
from tinyserve.frontend.streams import Piece


def per_call_us(fn: Callable[[], None], n: int) -> float:
    started = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - started) / n * 1e6


def stand_in_core() -> Any:
    """What EngineMeter reads of an EngineCore: a busy engine with 8 running requests."""
    stats = protocol.EngineStats(1, 8, 8, 0.01, 2, 8, 256, 40)
    return SimpleNamespace(
        tick=0,
        stats=lambda: stats,
        cache=SimpleNamespace(stats=CacheStats()),
        policy=[None, None],
        running=[None] * 8,
        slots=[None] * 8,
        blocks=SimpleNamespace(total=256, used=40, cached=12),
    )


def busy_tick(n_requests: int) -> list[protocol.TickOutput]:
    slot = protocol.Event(protocol.EVENT_SLOT, 1, 0, "arrival")
    updates = [protocol.RequestUpdate(f"r{i}", 1, token_ids=[7]) for i in range(n_requests)]
    updates[0] = protocol.RequestUpdate("r0", 1, token_ids=[7], events=[slot])
    updates[1] = protocol.RequestUpdate(
        "r1", 2, token_ids=[7], finish_reason=protocol.FINISH_LENGTH, prompt_tokens=30
    )
    stats = protocol.EngineStats(1, n_requests, n_requests, 0.01, 2, 8, 256, 40)
    return [protocol.TickOutput("f" * 32, updates, stats)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--passes", type=int, default=20000)
    args = parser.parse_args()
    n = args.passes
    with tempfile.TemporaryDirectory() as run_dir:
        m = metrics.setup(run_dir, metrics.ENGINE)
        metrics.setup(run_dir, metrics.FRONTEND)
        meter = EngineMeter(m, "fifo")
        core = stand_in_core()
        idle = per_call_us(lambda: meter.after_pass(core, [], 0), n)

        outputs = busy_tick(8)

        def busy() -> None:
            core.tick += 1
            core.blocks.used = 40 + core.tick % 2  # a gauge that changes, as in a busy engine
            meter.after_pass(core, outputs, 0)

        busy_us = per_call_us(busy, n)
        request = RequestMeter(m)
        piece = Piece("x", tokens=1)
        piece_us = per_call_us(lambda: request.piece(piece), n)
        scrape_ms = per_call_us(m.render, 200) / 1000
        size = len(m.render())
    print(f"engine pass, idle (gauges only):        {idle:7.1f} us")
    print(f"engine pass, tick of 8 requests:        {busy_us:7.1f} us")
    print(f"frontend, one output piece:             {piece_us:7.1f} us")
    print(f"GET /metrics render (1 process's files): {scrape_ms:6.2f} ms, {size} bytes")


if __name__ == "__main__":
    main()
