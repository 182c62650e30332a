"""The slots' KV blocks, queue depth and admission outcomes over time under sustained
open-loop load.

Requests arrive as a Poisson process at ``--rate`` per second for ``--seconds`` (prompt and
output lengths drawn per request, prompts sharing one of a few system prefixes, so free slots
keep blocks a later prompt reuses, and the prefix cache in host memory fills). Every
``--every`` seconds one sample reads, back to back: the board (the engine's own accounting,
which it writes each pass), the node's /metrics gauges, and the client's admission outcomes so
far. The KV blocks are the slots' cells (``--slots`` x ``--ctx-per-slot``): used (filled by
running requests), cached (kept by free slots of their last request) and free; the prefix
cache's bytes in host memory are sampled beside them. Each sample reconciles the two engine
views (used, cached, waiting, running): they are written from one snapshot per engine pass, so
under load they may differ by what one pass changed between the two reads; once idle they must
be equal. Writes bench/results/kv_occupancy.csv and .png.

    .venv/bin/python bench/kv_occupancy.py                          # five minutes
    .venv/bin/python bench/kv_occupancy.py --seconds 40             # short
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import time
from collections import Counter
from typing import Any

import aiohttp
from common import (
    Result,
    metric_sum,
    progress,
    prompt_of,
    save_plot,
    scrape,
    start_node,
    stream_request,
    wait_idle,
    write_csv,
)

from tinyserve_native.board import Board

PREFIXES = [prompt_of(96, salt) for salt in range(3)]  # shared system prompts
VIEWS = (  # (board field, /metrics gauge)
    ("blocks_used", "tinyserve_kv_blocks_used"),
    ("blocks_cached", "tinyserve_kv_blocks_cached"),
    ("waiting", "tinyserve_requests_waiting"),
    ("running", "tinyserve_requests_running"),
)


def sample(board: Board, url: str, outcomes: Counter[str], t: float) -> dict[str, Any]:
    snap = board.snapshot()
    metrics = scrape(url)
    row: dict[str, Any] = {"t_s": round(t, 2)}
    row["blocks_total"] = snap.blocks_total
    row["blocks_free"] = snap.blocks_total - snap.blocks_used - snap.blocks_cached
    mismatch = 0
    for field, gauge in VIEWS:
        ours, theirs = getattr(snap, field), metric_sum(metrics, gauge)
        row[field] = ours
        row[f"{field}_metrics"] = int(theirs)
        mismatch += ours != theirs
    row["views_differ"] = mismatch
    row["prefix_cache_mib"] = round(metric_sum(metrics, "tinyserve_prefix_cache_bytes") / 2**20, 1)
    row["accepted"] = outcomes["200"]
    row["rejected"] = sum(v for k, v in outcomes.items() if k != "200")
    return row


async def load(url: str, board: Board, args: argparse.Namespace) -> list[dict[str, Any]]:
    rng = random.Random(args.seed)
    outcomes: Counter[str] = Counter()
    rows: list[dict[str, Any]] = []
    tasks: list[asyncio.Task[Result]] = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1800)) as session:

        async def one(i: int) -> Result:
            prompt = rng.choice(PREFIXES) + " " + prompt_of(rng.randint(16, 256), 10_000 + i)
            body = {"prompt": prompt, "max_tokens": rng.randint(16, 160), "ignore_eos": True}
            result = await stream_request(session, url, body)
            outcomes["200" if result.status == 200 else result.reason or str(result.status)] += 1
            return result

        async def sampler() -> None:
            while True:
                t = time.perf_counter() - started
                rows.append(sample(board, url, outcomes, t))
                if len(rows) % 10 == 0:
                    progress(f"t={t:5.1f}s {rows[-1]}")
                await asyncio.sleep(args.every)

        started = time.perf_counter()
        watcher = asyncio.create_task(sampler())
        i = 0
        while time.perf_counter() - started < args.seconds:
            tasks.append(asyncio.create_task(one(i)))
            i += 1
            await asyncio.sleep(rng.expovariate(args.rate))
        await asyncio.gather(*tasks)
        watcher.cancel()
    progress(f"arrivals {i}; outcomes {dict(outcomes)}")
    return rows


def plot(rows: list[dict[str, Any]]) -> None:
    def draw(axes: list[Any]) -> None:
        top, bottom = axes
        t = [r["t_s"] for r in rows]
        layers = [[r[k] for r in rows] for k in ("blocks_used", "blocks_cached", "blocks_free")]
        top.stackplot(t, *layers, labels=["used (running)", "kept (free slots)", "free"])
        top.set(xlabel="s", ylabel="KV blocks", title="slots' KV blocks (board)")
        top.legend(loc="upper right")
        bottom.plot(t, [r["waiting"] for r in rows], label="waiting")
        bottom.plot(t, [r["running"] for r in rows], label="running")
        bottom.plot(t, [r["rejected"] for r in rows], label="rejected (cumulative)")
        bottom.set(xlabel="s", ylabel="requests", title="queue and admission")
        bottom.legend(loc="upper left")

    print(f"wrote {save_plot('kv_occupancy', draw, panels=2, width=7)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=300.0)
    parser.add_argument("--rate", type=float, default=1.5, help="arrivals per second")
    parser.add_argument("--every", type=float, default=0.5, help="seconds between samples")
    # Per slot: the longest request drawn (96 + 256 prompt tokens + 160) fits.
    parser.add_argument("--ctx-per-slot", type=int, default=768)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    node = start_node("--ctx-per-slot", str(args.ctx_per_slot), "--threads", str(args.threads),
                      "--max-queue", "16")  # fmt: skip
    board = Board.attach(str(node.runtime_dir / "board"))
    try:
        rows = asyncio.run(load(node.url, board, args))
        wait_idle(node)
        time.sleep(1.5)  # the gauges follow the engine's idle pass
        idle = sample(board, node.url, Counter(), -1)
    finally:
        board.close()
        node.stop(check=False)
    differ = sum(1 for r in rows if r["views_differ"])
    print(f"samples {len(rows)}; board and /metrics differed in {differ} (under load)")
    print(f"idle: {idle}")
    assert idle["views_differ"] == 0, "board and /metrics disagree at idle"
    print(f"wrote {write_csv('kv_occupancy', rows)}")
    plot(rows)


if __name__ == "__main__":
    main()
