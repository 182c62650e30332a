"""Retry-After under a burst, with clients that honour it as the openai client does.

A burst of ``--requests`` requests at once (one each: ``--max-tokens`` greedy tokens,
``ignore_eos``, prompts that share no prefix). A client refused with a 503 sleeps its
``Retry-After`` (at most 60 s, the openai client's cap) and tries again until it is served.
Per node and round: the makespan (burst sent to last request served), the 503s per request,
the seconds clients slept, and the seconds the engine held no request while clients were
still sleeping (idle: capacity a too-long Retry-After wasted; the board, sampled every 50 ms).

Nodes, on the same settings, driven in turn (the order rotating each round), each round
starting after ``--pause`` idle seconds, as a burst that comes after a quiet spell:

- ``queue``: ``--max-queue`` above the burst, so nothing is refused: the makespan without
  503s, the reference;
- ``node``: this tree's code with the default admission;
- ``baseline`` (``--baseline COMMIT``): that commit's code (``common.code_at``).

The figures are medians over rounds; ``ratio`` is a node's makespan over the queue node's in
the same round, median [range]. Writes ``bench/results/<--name>.csv``.

    .venv/bin/python bench/retry_after.py [--requests 120] [--max-tokens 32] [--rounds 3]
        [--baseline COMMIT]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import time
from dataclasses import dataclass
from typing import Any

import aiohttp
from common import code_at, percentile, progress, prompt_of, start_node, wait_idle, write_csv

from tests.integration.node import Node

OPENAI_RETRY_CAP_S = 60.0  # the openai client sleeps at most this long for a Retry-After
SAMPLE_S = 0.05


@dataclass
class Served:
    attempts: int
    slept: float
    seconds: float


async def client(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> Served:
    """One request, retried after each 503's Retry-After until it is served."""
    attempts, slept, started = 0, 0.0, time.perf_counter()
    while True:
        attempts += 1
        async with session.post(f"{url}/generate", json=body) as resp:
            await resp.read()
            if resp.status != 503:
                assert resp.status == 200, resp.status
                return Served(attempts, slept, time.perf_counter() - started)
            wait = min(float(resp.headers.get("Retry-After", "1")), OPENAI_RETRY_CAP_S)
        slept += wait
        await asyncio.sleep(wait)


async def engine_idle(node: Node, done: asyncio.Event) -> float:
    """Seconds the engine held no request, until ``done``."""
    from tinyserve_native.board import Board

    board = Board.attach(str(node.runtime_dir / "board"))
    idle = 0.0
    try:
        while not done.is_set():
            snap = board.snapshot()
            if not (snap.running or snap.waiting):
                idle += SAMPLE_S
            await asyncio.sleep(SAMPLE_S)
    finally:
        board.close()
    return idle


async def burst(node: Node, requests: int, max_tokens: int, salt: int) -> dict[str, float]:
    bodies = [
        {"prompt": prompt_of(24, salt + i), "max_tokens": max_tokens, "ignore_eos": True}
        for i in range(requests)
    ]
    done = asyncio.Event()
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=3600)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        idle = asyncio.create_task(engine_idle(node, done))
        started = time.perf_counter()
        served = await asyncio.gather(*(client(session, node.url, b) for b in bodies))
        makespan = time.perf_counter() - started
        done.set()
        idle_s = await idle
    latencies = [s.seconds for s in served]
    return {
        "makespan_s": round(makespan, 2),
        "rejections_per_request": round(sum(s.attempts - 1 for s in served) / requests, 2),
        "slept_s_mean": round(statistics.mean(s.slept for s in served), 2),
        "engine_idle_s": round(idle_s, 2),
        "latency_p50_s": round(percentile(latencies, 0.5), 2),
        "latency_p95_s": round(percentile(latencies, 0.95), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=120)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pause", type=float, default=12.0, help="idle seconds before a burst")
    parser.add_argument("--baseline", metavar="COMMIT", help="also run this commit's code")
    parser.add_argument("--name", default="retry_after", help="the CSV's name in bench/results/")
    args = parser.parse_args()

    rows: list[dict[str, Any]] = []
    with code_at(args.baseline) as baseline, contextlib.ExitStack() as stack:
        nodes = {
            "queue": start_node("--max-queue", str(args.requests + 8), frontends=2),
            "node": start_node(frontends=2),
        }
        if baseline is not None:
            nodes["baseline"] = start_node(frontends=2, code=baseline)
        for node in nodes.values():
            stack.callback(node.stop)
        names = list(nodes)
        for round_ in range(args.rounds):
            order = names[round_ % len(names) :] + names[: round_ % len(names)]
            for name in order:
                wait_idle(nodes[name])
                time.sleep(args.pause)
                salt = (round_ * len(names) + names.index(name)) * args.requests
                figures = asyncio.run(burst(nodes[name], args.requests, args.max_tokens, salt))
                rows.append({"round": round_, "node": name, **figures})
                progress(f"round {round_} {name}: {figures}")
    for row in rows:
        [queue] = [r for r in rows if r["round"] == row["round"] and r["node"] == "queue"]
        row["ratio"] = round(row["makespan_s"] / queue["makespan_s"], 3)
    summarize(rows, names, args)
    print(f"wrote {write_csv(args.name, rows)}")


def summarize(rows: list[dict[str, Any]], names: list[str], args: argparse.Namespace) -> None:
    print(
        f"\n{args.requests} requests of {args.max_tokens} tokens at once, {args.rounds} rounds"
        + (f"; baseline {args.baseline}" if args.baseline else "")
    )
    keys = [k for k in rows[0] if k not in ("round", "node")]
    print("node | " + " | ".join(keys))
    for name in names:
        own = [r for r in rows if r["node"] == name]
        cells = []
        for key in keys:
            values = [r[key] for r in own]
            cell = f"{statistics.median(values):g}"
            if key == "ratio":
                cell += f" [{min(values):g}-{max(values):g}]"
            cells.append(cell)
        print(f"{name} | " + " | ".join(cells))


if __name__ == "__main__":
    main()
