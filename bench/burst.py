"""Admission under bursts: N simultaneous streaming requests through two frontends.

For each burst size: how many were accepted, how many rejected and why (queue_full: the
queue of requests waiting for a slot was at --max-queue; any other 503, which a burst should
not cause), and the accepted requests' TTFT p50/p95. Writes bench/results/burst.csv and
burst.png.

    .venv/bin/python bench/burst.py [--sizes 1,2,4,8,16,32,64] [--max-tokens 128]
"""

from __future__ import annotations

import argparse
import asyncio
from collections import Counter

import aiohttp
from common import RESULTS, percentile, start_node, stream_request, wait_idle, write_csv

PROMPT = "Write a story about a robot who learns to paint. Once upon a time,"


async def burst(url: str, size: int, max_tokens: int) -> list[dict[str, object]]:
    body = {"prompt": PROMPT, "max_tokens": max_tokens}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        results = await asyncio.gather(*(stream_request(session, url, body) for _ in range(size)))
    return [r.__dict__ for r in results]


def plot(rows: list[dict[str, object]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = [str(r["burst"]) for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    bottom = [0] * len(rows)
    for key, colour in (
        ("accepted", "tab:green"),
        ("queue_full", "tab:orange"),
        ("other_503", "tab:red"),
    ):
        values = [int(r[key]) for r in rows]  # type: ignore[call-overload]
        left.bar(sizes, values, bottom=bottom, label=key, color=colour)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    left.set(xlabel="burst size", ylabel="requests", title="admission")
    left.legend()
    right.plot(sizes, [r["ttft_p50_s"] for r in rows], marker="o", label="p50")
    right.plot(sizes, [r["ttft_p95_s"] for r in rows], marker="o", label="p95")
    right.set(xlabel="burst size", ylabel="TTFT of accepted requests (s)", title="latency")
    right.legend()
    fig.tight_layout()
    fig.savefig(RESULTS / "burst.png", dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1,2,4,8,16,32,64")
    parser.add_argument("--max-tokens", type=int, default=128)
    args = parser.parse_args()
    node = start_node(frontends=2)
    rows = []
    print(
        f"{'burst':>5} {'accepted':>8} {'queue_full':>10} {'other503':>8} "
        f"{'TTFT p50':>9} {'TTFT p95':>9}"
    )
    try:
        for size in [int(s) for s in args.sizes.split(",")]:
            results = asyncio.run(burst(node.url, size, args.max_tokens))
            wait_idle(node)
            reasons = Counter(str(r["reason"]) for r in results if r["status"] == 503)
            ttft = [float(r["ttft"]) for r in results if r["ttft"] is not None]  # type: ignore[arg-type]
            row = {
                "burst": size,
                "accepted": sum(1 for r in results if r["status"] == 200),
                "queue_full": reasons["queue_full"],
                "other_503": sum(reasons.values()) - reasons["queue_full"],
                "other": sum(1 for r in results if r["status"] not in (200, 503)),
                "ttft_p50_s": round(percentile(ttft, 0.5), 3),
                "ttft_p95_s": round(percentile(ttft, 0.95), 3),
            }
            rows.append(row)
            print(
                f"{size:>5} {row['accepted']:>8} {row['queue_full']:>10} "
                f"{row['other_503']:>8} {row['ttft_p50_s']:>8.3f}s "
                f"{row['ttft_p95_s']:>8.3f}s",
                flush=True,
            )
    finally:
        node.stop(check=False)
    print(f"wrote {write_csv('burst', rows)}")
    plot(rows)
    print(f"wrote {RESULTS / 'burst.png'}")


if __name__ == "__main__":
    main()
