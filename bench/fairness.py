"""Each scheduling policy under saturation with two classes of clients.

Class "a" (tenant a, priority 5) and class "b" (tenant b, priority 0) each run the same number
of closed-loop streaming clients, together more than the engine's slots, for a fixed time.
For each policy (WFQ with tenant weights a=3,b=1): per-class mean and p95 TTFT, the share of
generated tokens each class got, and the a/b ratios. Writes bench/results/fairness.csv and
fairness.png.

    .venv/bin/python bench/fairness.py [--seconds 40] [--clients 8]
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
) -> dict[str, list[Result]]:
    results: dict[str, list[Result]] = {name: [] for name in CLASSES}
    stop_at = time.perf_counter() + seconds
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:

        async def client(name: str, index: int) -> None:
            body = {
                "prompt": f"Client {index} of class {name}: 1, 2, 3,",
                "max_tokens": max_tokens,
                **CLASSES[name],
            }
            while time.perf_counter() < stop_at:
                results[name].append(await stream_request(session, url, body))

        await asyncio.gather(*(client(n, i) for n in CLASSES for i in range(clients)))
    return results


def summarise(policy: str, results: dict[str, list[Result]]) -> dict[str, object]:
    tokens = {n: sum(r.tokens for r in rs) for n, rs in results.items()}
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
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--clients", type=int, default=8, help="clients per class")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--policies", default=",".join(POLICIES))
    args = parser.parse_args()
    rows = []
    for policy in args.policies.split(","):
        node = start_node("--policy", policy, *POLICIES[policy], "--max-queue", "256", frontends=2)
        try:
            results = asyncio.run(saturate(node.url, args.clients, args.seconds, args.max_tokens))
        finally:
            node.stop(check=False)
        rows.append(summarise(policy, results))
        print(rows[-1], flush=True)
    print(f"wrote {write_csv('fairness', rows)}")
    plot(rows)
    print(f"wrote {RESULTS / 'fairness.png'}")


if __name__ == "__main__":
    main()
