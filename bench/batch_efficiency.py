"""How well ticks are filled under different request-size distributions.

For each distribution (uniform short, uniform long, mixed heavy-tailed prompt and output
lengths) ``--clients`` closed-loop streaming clients send ``--requests`` requests in all to one
node. From the engine's own metrics (read from /metrics before and after): ticks, tokens per
tick, mean tick (llama_decode) time, the decode and prefill shares of the batched tokens, and
the share of wall time spent inside llama_decode; generated tokens/s against the bare
batched-decode ceiling at a batch of ``--slots`` measured in the same run (a decode-only
upper bound: it prefills nothing). Writes bench/results/batch_efficiency.csv and .png.

    .venv/bin/python bench/batch_efficiency.py                         # full
    .venv/bin/python bench/batch_efficiency.py --requests 12 --scale 0.3   # short
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import time
from collections.abc import Callable
from typing import Any

import aiohttp
from common import (
    metric_sum,
    progress,
    prompt_of,
    report,
    save_plot,
    scrape,
    start_node,
    stream_request,
    wait_idle,
)
from throughput import ceiling_in_subprocess


def _pareto(rng: random.Random, low: int, high: int, alpha: float = 1.2) -> int:
    return min(high, int(low * rng.paretovariate(alpha)))


# (prompt tokens, max_tokens) per request, from a seeded generator.
DISTRIBUTIONS: dict[str, Callable[[random.Random], tuple[int, int]]] = {
    "uniform_short": lambda rng: (rng.randint(16, 48), rng.randint(16, 48)),
    "uniform_long": lambda rng: (rng.randint(768, 1280), rng.randint(192, 320)),
    "mixed_heavy_tail": lambda rng: (_pareto(rng, 16, 2048), _pareto(rng, 8, 512)),
}

SERIES = (
    "tinyserve_decode_step_seconds_count",
    "tinyserve_decode_step_seconds_sum",
    "tinyserve_batch_tokens_sum",
    "tinyserve_generation_tokens_total",
)


async def drive(url: str, sizes: list[tuple[int, int]], clients: int, salt: int) -> int:
    """Closed loop over ``sizes``; returns the requests that ended with a 200."""
    queue = list(enumerate(sizes))
    ok = 0
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1800)) as session:

        async def client() -> None:
            nonlocal ok
            while queue:
                i, (prompt, out) = queue.pop()
                body = {"prompt": prompt_of(prompt, salt + i), "max_tokens": out,
                        "ignore_eos": True}  # fmt: skip
                result = await stream_request(session, url, body)
                ok += result.status == 200  # after the await: ``ok +=`` reads it first

        await asyncio.gather(*(client() for _ in range(clients)))
    return ok


def measure(url: str, name: str, args: argparse.Namespace, salt: int) -> dict[str, Any]:
    rng = random.Random(args.seed)
    drawn = [DISTRIBUTIONS[name](rng) for _ in range(args.requests)]
    sizes = [(max(12, round(p * args.scale)), max(1, round(o * args.scale))) for p, o in drawn]
    before = scrape(url)
    started = time.perf_counter()
    ok = asyncio.run(drive(url, sizes, args.clients, salt))
    wall = time.perf_counter() - started
    after = scrape(url)
    d = {s: metric_sum(after, s) - metric_sum(before, s) for s in SERIES}
    ticks = d["tinyserve_decode_step_seconds_count"] or 1
    tokens = d["tinyserve_batch_tokens_sum"]
    generated = d["tinyserve_generation_tokens_total"]
    decode_rows = generated - ok  # each request's first token comes from its last prefill row
    return {
        "distribution": name,
        "requests_ok": ok,
        "prompt_tokens_mean": round(sum(p for p, _ in sizes) / len(sizes)),
        "max_tokens_mean": round(sum(o for _, o in sizes) / len(sizes)),
        "ticks": int(ticks),
        "tokens_per_tick": round(tokens / ticks, 1),
        "tick_ms": round(d["tinyserve_decode_step_seconds_sum"] / ticks * 1e3, 1),
        "decode_share": round(decode_rows / tokens, 3) if tokens else None,
        "prefill_share": round(1 - decode_rows / tokens, 3) if tokens else None,
        "in_decode_share": round(d["tinyserve_decode_step_seconds_sum"] / wall, 3),
        "generated_tok_s": round(generated / wall, 1),
        "wall_s": round(wall, 1),
    }


def plot(rows: list[dict[str, Any]]) -> None:
    def draw(axes: list[Any]) -> None:
        left, right = axes
        names = [r["distribution"] for r in rows]
        x = range(len(rows))
        decode = [r["tokens_per_tick"] * r["decode_share"] for r in rows]
        prefill = [r["tokens_per_tick"] * r["prefill_share"] for r in rows]
        left.bar(x, decode, label="decode rows")
        left.bar(x, prefill, bottom=decode, label="prefill rows")
        left.set(xticks=list(x), xticklabels=names, ylabel="tokens per tick")
        left.legend()
        right.bar(x, [r["ratio_to_ceiling"] for r in rows])
        right.set(xticks=list(x), xticklabels=names, ylabel="generated tok/s / bare ceiling")

    print(f"wrote {save_plot('batch_efficiency', draw, panels=2, width=7)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=64, help="per distribution")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--scale", type=float, default=1.0, help="lengths x this (short runs)")
    parser.add_argument("--distributions", default=",".join(DISTRIBUTIONS))
    args = parser.parse_args()
    # The longest request drawn (2048 prompt tokens + 512) fits a slot.
    flags = ["--threads", str(args.threads), "--slots", str(args.slots), "--ctx-per-slot", "2560"]
    node = start_node(*flags, "--max-queue", "256")
    rows = []
    try:
        for i, name in enumerate(args.distributions.split(",")):
            rows.append(measure(node.url, name, args, salt=100_000 * (i + 1)))
            wait_idle(node)
            progress(f"{name}: {rows[-1]}")
    finally:
        node.stop(check=False)
    ceiling_args = argparse.Namespace(
        prompt_tokens=16, max_tokens=64, threads=args.threads, ctx_per_slot=512
    )
    ceiling = ceiling_in_subprocess(args.slots, ceiling_args)
    progress(f"bare batched decode at batch {args.slots}: {ceiling:.1f} tok/s")
    for row in rows:
        row["ceiling_tok_s"] = round(ceiling, 1)
        row["ratio_to_ceiling"] = round(row["generated_tok_s"] / ceiling, 3)
    report("batch_efficiency", rows)
    plot(rows)


if __name__ == "__main__":
    main()
