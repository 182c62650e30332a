"""All five scheduling policies on one mixed workload with deadlines.

Two classes of closed-loop streaming clients, together more than the node's slots:
``interactive`` (tenant a, priority 5, ~32-token prompts, 16 tokens out, a 4 s deadline) and
``batch`` (tenant b, priority 0, ~512-token prompts, 128 tokens out, a 60 s deadline). For
each policy (WFQ with ``--tenant-weights a=3,b=1``) a fresh node runs the workload for
``--seconds``; per class: requests finished, mean and p99 TTFT, the deadline hit rate (the
share of finished requests that did not end ``deadline_missed``), and the generated tokens/s
of the finished requests. Writes bench/results/policies.csv and .png.

    .venv/bin/python bench/policies.py                                  # 60 s per policy
    .venv/bin/python bench/policies.py --seconds 30 --clients 4 --batch-scale 0.25  # short
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from typing import Any

import aiohttp
from common import (
    Result,
    mean,
    percentile,
    progress,
    prompt_of,
    report,
    save_plot,
    start_node,
    stream_request,
)

CLASSES: dict[str, dict[str, Any]] = {
    "interactive": {"tenant": "a", "priority": 5, "deadline_ms": 4000, "max_tokens": 16},
    "batch": {"tenant": "b", "priority": 0, "deadline_ms": 60000, "max_tokens": 128},
}
PROMPT_TOKENS = {"interactive": 32, "batch": 512}
POLICIES: dict[str, list[str]] = {
    "fifo": [],
    "priority": [],
    "wfq": ["--tenant-weights", "a=3,b=1"],
    "deadline": [],
    "srpt": [],
}


async def workload(
    url: str, clients: int, seconds: float, batch_scale: float
) -> tuple[dict[str, list[Result]], int]:
    """Both classes for ``seconds``; the requests that finished, and the tokens generated.
    ``batch_scale`` shrinks the batch class's prompt and output (short runs)."""
    sizes = {name: (PROMPT_TOKENS[name], CLASSES[name]["max_tokens"]) for name in CLASSES}
    prompt, out = sizes["batch"]
    sizes["batch"] = (max(12, round(prompt * batch_scale)), max(1, round(out * batch_scale)))
    results: dict[str, list[Result]] = {name: [] for name in CLASSES}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=900)) as session:

        async def client(name: str, index: int) -> None:
            n = 0
            while True:
                n += 1
                salt = (1 + list(CLASSES).index(name)) * 1_000_000 + index * 10_000 + n
                prompt, out = sizes[name]
                body = {**CLASSES[name], "prompt": prompt_of(prompt, salt), "max_tokens": out}
                results[name].append(await stream_request(session, url, body))
                if results[name][-1].status != 200:
                    await asyncio.sleep(0.5)  # turned away (503): do not spin

        tasks = [asyncio.create_task(client(n, i)) for n in CLASSES for i in range(clients)]
        await asyncio.sleep(seconds)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return results, sum(r.tokens for rs in results.values() for r in rs)


def summarise(
    policy: str, results: dict[str, list[Result]], tokens: int, wall: float
) -> dict[str, Any]:
    row: dict[str, Any] = {"policy": policy}
    for name, rs in results.items():
        done = [r for r in rs if r.status == 200]
        ttft = [r.ttft for r in done if r.ttft is not None]
        hit = [r for r in done if r.finish_reason != "deadline_missed"]
        row[f"{name}_finished"] = len(done)
        row[f"{name}_rejected"] = len(rs) - len(done)
        row[f"{name}_ttft_mean_s"] = round(mean(ttft), 3)
        row[f"{name}_ttft_p99_s"] = round(percentile(ttft, 0.99), 3)
        row[f"{name}_deadline_hit"] = round(len(hit) / len(done), 3) if done else None
    row["generated_tok_s"] = round(tokens / wall, 1)
    return row


def plot(rows: list[dict[str, Any]]) -> None:
    def draw(axes: list[Any]) -> None:
        left, right = axes
        x = range(len(rows))
        names = [r["policy"] for r in rows]
        for offset, name in ((-0.2, "interactive"), (0.2, "batch")):
            xs = [i + offset for i in x]
            left.bar(xs, [r[f"{name}_ttft_mean_s"] for r in rows], 0.4, label=name)
            right.bar(xs, [r[f"{name}_deadline_hit"] or 0 for r in rows], 0.4, label=name)
        left.set(xticks=list(x), xticklabels=names, ylabel="mean TTFT (s)")
        right.set(xticks=list(x), xticklabels=names, ylabel="deadline hit rate", ylim=(0, 1.05))
        left.legend()
        right.legend()

    print(f"wrote {save_plot('policies', draw, panels=2)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--clients", type=int, default=8, help="clients per class")
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--batch-scale", type=float, default=1.0, help="batch class sizes x")
    args = parser.parse_args()
    rows = []
    for policy in args.policies.split(","):
        flags = ["--policy", policy, *POLICIES[policy], "--slots", str(args.slots)]
        # A slot's cells hold a batch request (512 + 128 tokens) three times over.
        flags += ["--threads", str(args.threads), "--ctx-per-slot", "2048", "--max-queue", "256"]
        node = start_node(*flags)
        try:
            started = time.perf_counter()
            work = workload(node.url, args.clients, args.seconds, args.batch_scale)
            results, tokens = asyncio.run(work)
            wall = time.perf_counter() - started
        finally:
            node.stop(check=False)
        rows.append(summarise(policy, results, tokens, wall))
        progress(f"{policy}: {rows[-1]}")
    report("policies", rows)
    plot(rows)


if __name__ == "__main__":
    main()
