"""Cost of constrained decoding: aggregate throughput at c=8 with every request constrained by
a JSON schema vs none, interleaved rounds in one run on one node.

Both kinds generate exactly ``--max-tokens`` tokens per request: the unconstrained ones with
``ignore_eos``, the constrained ones with a schema (an array of at least 1000 bounded
integers) that cannot end sooner. Prints tok/s per round, the medians and their ratio, and
the grammar build times and full-vocabulary grammar passes the timelines report.

    .venv/bin/python bench/constrained.py
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

import aiohttp
from common import start_node, stream_request, wait_idle

PROMPT = "Here are some numbers as a JSON array:"
SCHEMA = {
    "type": "array",
    "items": {"type": "integer", "minimum": 0, "maximum": 999},
    "minItems": 1000,
}


async def one_round(url: str, body: dict[str, Any], clients: int) -> float:
    """Generated tok/s of ``clients`` concurrent streaming requests."""
    async with aiohttp.ClientSession() as session:
        started = time.perf_counter()
        results = await asyncio.gather(
            *(stream_request(session, url, body) for _ in range(clients))
        )
        elapsed = time.perf_counter() - started
    assert all(r.status == 200 and r.finish_reason == "length" for r in results), results
    return sum(r.tokens for r in results) / elapsed


async def grammar_figures(url: str, clients: int, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The timelines' ``grammar`` of ``clients`` concurrent constrained requests."""
    async with aiohttp.ClientSession() as session:

        async def one() -> dict[str, Any]:
            async with session.post(f"{url}/generate", json={**body, "timeline": True}) as r:
                grammar: dict[str, Any] = (await r.json())["timeline"]["grammar"]
                return grammar

        return list(await asyncio.gather(*(one() for _ in range(clients))))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    base = {"prompt": PROMPT, "max_tokens": args.max_tokens, "temperature": 0.8, "seed": 1}
    kinds = {"none": {**base, "ignore_eos": True}, "json_schema": {**base, "json_schema": SCHEMA}}
    node = start_node("--slots", str(args.clients), "--no-prefix-cache")
    figures: dict[str, list[float]] = {kind: [] for kind in kinds}
    try:
        for round_ in range(args.rounds):
            for kind, body in kinds.items():
                wait_idle(node)
                tps = asyncio.run(one_round(node.url, body, args.clients))
                figures[kind].append(tps)
                print(f"round {round_ + 1} {kind:>11}: {tps:6.1f} tok/s", flush=True)
        grammars = asyncio.run(grammar_figures(node.url, args.clients, kinds["json_schema"]))
    finally:
        node.stop()
    medians = {kind: statistics.median(values) for kind, values in figures.items()}
    for kind, value in medians.items():
        print(f"median {kind:>11}: {value:6.1f} tok/s")
    print(f"constrained / unconstrained: {medians['json_schema'] / medians['none']:.2f}")
    builds = [g["build_ms"] for g in grammars]
    passes = sum(g["full_passes"] for g in grammars)
    print(f"grammar build_ms at the slot grant: min {min(builds)} max {max(builds)}")
    print(f"full grammar passes: {passes} of {len(grammars) * args.max_tokens} tokens")


if __name__ == "__main__":
    main()
