"""Each scheduling policy under saturation with two classes of clients.

Class "a" (tenant a, priority 5) and class "b" (tenant b, priority 0) each run the same number
of closed-loop streaming clients, each class alone more than the engine's slots (so both always
have requests waiting when a slot frees), for a fixed time.
For each policy (WFQ with tenant weights a=3,b=1): per-class mean and p95 TTFT of the requests
that finished in the window, the share of generated tokens each class received after the
first quarter of the window (the start-up transient), and the a/b ratios. Writes
bench/results/fairness.csv and fairness.png.

    .venv/bin/python bench/fairness.py [--seconds 60] [--clients 16]
"""

from __future__ import annotations

import argparse
import asyncio
import time

import aiohttp
from common import RESULTS, Result, mean, percentile, start_node, stream_request, write_csv

CLASSES = {"a": {"tenant": "a", "priority": 5}, "b": {"tenant": "b", "priority": 0}}
POLICIES = {"fifo": [], "priority": [], "wfq": ["--tenant-weights", "a=3,b=1"]}


async def saturate(
    url: str, clients: int, seconds: float, max_tokens: int
) -> tuple[dict[str, list[Result]], dict[str, int]]:
    """Run both classes for ``seconds``, then drop every client at once (a tail in which only
    one class still has requests would skew the shares). Returns the requests that finished
    in the window and, per class, the text events (about one per token) received in it."""
    results: dict[str, list[Result]] = {name: [] for name in CLASSES}
    times: dict[str, list[float]] = {name: [] for name in CLASSES}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:

        async def client(name: str, index: int) -> None:
            body = {
                "prompt": f"Client {index} of class {name}: 1, 2, 3,",
                "max_tokens": max_tokens,
                **CLASSES[name],
            }
            while True:
                results[name].append(
                    await stream_request(session, url, body, text_times=times[name])
                )

        tasks = [asyncio.create_task(client(n, i)) for n in CLASSES for i in range(clients)]
        started = time.perf_counter()
        await asyncio.sleep(seconds)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    # The first quarter is the start-up transient (everyone arrives at once): not counted.
    counted_from = started + seconds / 4
    tokens = {n: sum(1 for t in ts if t >= counted_from) for n, ts in times.items()}
    return results, tokens


def summarise(
    policy: str, results: dict[str, list[Result]], tokens: dict[str, int]
) -> dict[str, object]:
    ttft = {n: [r.ttft for r in rs if r.ttft is not None] for n, rs in results.items()}
    total = sum(tokens.values()) or 1
    row: dict[str, object] = {"policy": policy}
    for n in CLASSES:
        row[f"{n}_requests"] = len(results[n])
        row[f"{n}_ttft_mean_s"] = round(mean(ttft[n]), 3)
        row[f"{n}_ttft_p95_s"] = round(percentile(ttft[n], 0.95), 3)
        row[f"{n}_token_share"] = round(tokens[n] / total, 3)
    row["share_ratio_a_b"] = round(tokens["a"] / max(tokens["b"], 1), 2)
    row["ttft_ratio_b_a"] = round(mean(ttft["b"]) / mean(ttft["a"]), 2)
    return row


def plot(rows: list[dict[str, object]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [str(r["policy"]) for r in rows]
    x = range(len(rows))
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for offset, n in ((-0.2, "a"), (0.2, "b")):
        left.bar(
            [i + offset for i in x], [r[f"{n}_token_share"] for r in rows], 0.4, label=f"class {n}"
        )
        right.bar(
            [i + offset for i in x], [r[f"{n}_ttft_mean_s"] for r in rows], 0.4, label=f"class {n}"
        )
    left.set(xticks=list(x), xticklabels=names, ylabel="share of generated tokens")
    right.set(xticks=list(x), xticklabels=names, ylabel="mean TTFT (s)")
    left.legend()
    right.legend()
    fig.tight_layout()
    fig.savefig(RESULTS / "fairness.png", dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--clients", type=int, default=16, help="clients per class")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--policies", default=",".join(POLICIES))
    args = parser.parse_args()
    rows = []
    for policy in args.policies.split(","):
        node = start_node("--policy", policy, *POLICIES[policy], "--max-queue", "256", frontends=2)
        try:
            results, tokens = asyncio.run(
                saturate(node.url, args.clients, args.seconds, args.max_tokens)
            )
        finally:
            node.stop(check=False)
        rows.append(summarise(policy, results, tokens))
        print(rows[-1], flush=True)
    print(f"wrote {write_csv('fairness', rows)}")
    plot(rows)
    print(f"wrote {RESULTS / 'fairness.png'}")


if __name__ == "__main__":
    main()
