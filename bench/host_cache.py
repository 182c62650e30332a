"""The prefix cache's host-memory tier and its files across restarts, in one run.

(a) crossover, in-process: prefilling n tokens vs copying their KV out to host memory and
    back (per 16-token block: ``seq_cp`` onto a scratch sequence + ``get_data``; ``set_data``
    + ``seq_cp``), for n = 16..512: where restoring stops paying, if anywhere.
(b) multi-turn chats with more conversations than the cells hold (a small ``--ctx``), turns
    taken round-robin, one request at a time: TTFT p50/p95 and prompt tokens served from the
    cache (from host memory among them), with the host tier off and on.
(c) restart: a node with ``--cache-dir`` serves every conversation's first turn and is
    stopped (SIGTERM writes its cache); each conversation's second turn then goes to a node
    started on that directory (warm) and to one started on an empty one (cold): TTFT.

Writes bench/results/host_cache.csv (b, c), host_cache_crossover.csv (a) and host_cache.png.

    .venv/bin/python bench/host_cache.py --threads 1
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
from common import (
    Result,
    percentile,
    progress,
    report,
    save_plot,
    start_node,
    stream_request,
    write_csv,
)

SYSTEM = (
    "<|im_start|>system\nYou are the guide of a small museum of maritime history. Answer "
    "visitors' questions about ships, harbours, lighthouses and navigation in two short "
    "sentences, and never invent dates or names you are not sure of.<|im_end|>\n"
)
TOPICS = ["lighthouses", "clippers", "sextants", "harbours", "steamships", "charts", "knots"]


def user_turn(text: str) -> str:
    return f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"


def opening(i: int) -> str:
    """Each conversation's own opening: distinct from its first tokens on, so conversations
    share nothing but what a block-aligned cache cannot use."""
    return f"<|im_start|>system\nVisitor {i} of the day.<|im_end|>\n" + SYSTEM


# -- (a) crossover -------------------------------------------------------------------------


def crossover(threads: int, lengths: list[int], repeats: int) -> list[dict[str, Any]]:
    """Prefill vs save + restore of the same tokens' KV, medians of ``repeats``."""
    from tinyserve.engine.runtime import LlamaRuntime, RuntimeSpec
    from tinyserve.model import resolve_model_path

    spec = RuntimeSpec(resolve_model_path(None), 2048, 4, 512, threads)
    runtime = LlamaRuntime(spec)
    rows = []
    try:
        for n in lengths:
            tokens = [(i * 37) % 1000 + 100 for i in range(n)]
            runs = [_measure(runtime, tokens) for _ in range(repeats)]
            prefill, save, restore = ([run[i] for run in runs] for i in range(3))
            row = {
                "tokens": n,
                "prefill_ms": round(percentile(prefill, 0.5) * 1e3, 2),
                "save_ms": round(percentile(save, 0.5) * 1e3, 2),
                "restore_ms": round(percentile(restore, 0.5) * 1e3, 2),
                "kv_kib_per_block": round(runs[0][3] / 1024, 1),
            }
            row["prefill_over_restore"] = round(row["prefill_ms"] / max(row["restore_ms"], 1e-3))
            rows.append(row)
            progress(f"crossover: {row}")
    finally:
        runtime.close()
    return rows


def _measure(runtime: Any, tokens: list[int]) -> tuple[float, float, float, int]:
    """Seconds to prefill ``tokens``, to save their blocks, to restore them; one block's KV
    bytes."""
    runtime.clear()
    t0 = time.perf_counter()
    _prefill(runtime, tokens)
    t1 = time.perf_counter()
    blocks = _save(runtime, len(tokens))
    t2 = time.perf_counter()
    runtime.clear()
    t3 = time.perf_counter()
    _restore(runtime, blocks)
    t4 = time.perf_counter()
    return t1 - t0, t2 - t1, t4 - t3, len(blocks[0])


def _prefill(runtime: Any, tokens: list[int]) -> None:
    runtime.batch.clear()
    runtime.batch.add_span(tokens, 0, len(tokens), 0, 0, True)
    assert runtime.decode() == 0


def _save(runtime: Any, n: int) -> list[bytes]:
    """What the prefix cache does per evicted block: tag it onto the scratch id, copy out."""
    blocks = []
    for start in range(0, n, 16):
        runtime.share(0, 3, start, start + 16)
        blocks.append(runtime.save_seq(3))
        runtime.forget(3)
    return blocks


def _restore(runtime: Any, blocks: list[bytes]) -> None:
    for i, kv in enumerate(blocks):
        assert runtime.load_seq(3, kv)
        runtime.share(3, 1, i * 16, i * 16 + 16)
        runtime.forget(3)


# -- (b) and (c) on nodes ------------------------------------------------------------------


async def turn(
    session: aiohttp.ClientSession, url: str, history: str, question: str, max_tokens: int
) -> tuple[Result, str]:
    prompt = history + user_turn(question)
    text: list[str] = []
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0}
    result = await stream_request(session, url, body, text_sink=text)
    assert result.status == 200, result.reason
    return result, prompt + "".join(text) + "<|im_end|>\n"


def question(i: int, t: int) -> str:
    return f"Question {t + 1}: what should I know about {TOPICS[(i + t) % len(TOPICS)]}?"


async def chats(url: str, n: int, turns: int, max_tokens: int) -> list[Result]:
    """``n`` conversations, their turns round-robin (every first turn, then every second...)."""
    histories = [opening(i) for i in range(n)]
    results = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        for t in range(turns):
            for i in range(n):
                result, histories[i] = await turn(
                    session, url, histories[i], question(i, t), max_tokens
                )
                results.append(result)
            progress(f"  turn {t + 1} of {n} conversations done")
    return results


async def first_turns(url: str, n: int, max_tokens: int) -> list[str]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        return [
            (await turn(session, url, opening(i), question(i, 0), max_tokens))[1] for i in range(n)
        ]


async def second_turns(url: str, histories: list[str], max_tokens: int) -> list[Result]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        return [
            (await turn(session, url, h, question(i, 1), max_tokens))[0]
            for i, h in enumerate(histories)
        ]


def row(case: str, mode: str, results: list[Result], host_tokens: float) -> dict[str, Any]:
    ttft = [r.ttft for r in results if r.ttft is not None]
    prompt = sum(r.prompt_tokens for r in results)
    cached = sum(r.cached_tokens for r in results)
    return {
        "case": case,
        "mode": mode,
        "requests": len(results),
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "from_host_tokens": int(host_tokens),
        "cached_share": round(cached / prompt, 3) if prompt else 0,
        "ttft_p50_s": round(percentile(ttft, 0.5), 3),
        "ttft_p95_s": round(percentile(ttft, 0.95), 3),
    }


def host_tokens(url: str) -> float:
    from common import metric_sum, scrape

    return metric_sum(scrape(url), "tinyserve_prefix_cache_host_hit_tokens_total")


def multi_turn(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    for mode, mb in (("host tier off", "0"), ("host tier on", str(args.host_cache_mb))):
        progress(f"(b) {mode}")
        node = start_node(*args.node_flags, "--host-cache-mb", mb)
        try:
            results = asyncio.run(chats(node.url, args.conversations, args.turns, args.max_tokens))
            rows.append(row("multi-turn", mode, results, host_tokens(node.url)))
        finally:
            node.stop(check=False)
        progress(f"  {rows[-1]}")
    return rows


def restart(args: argparse.Namespace) -> list[dict[str, Any]]:
    kept, empty = (Path(tempfile.mkdtemp(prefix="tinyserve-cache-")) for _ in range(2))
    progress("(c) first turns on a node with --cache-dir, then SIGTERM")
    node = start_node(*args.node_flags, "--cache-dir", str(kept))
    try:
        histories = asyncio.run(first_turns(node.url, args.conversations, args.max_tokens))
    finally:
        node.stop(check=False)
    size = sum(p.stat().st_size for p in kept.glob("prefix-*.bin"))
    progress(f"  wrote {size / 2**20:.1f} MiB to {kept}")
    rows = []
    for mode, directory in (("restart cold", empty), ("restart warm", kept)):
        started = time.perf_counter()
        node = start_node(*args.node_flags, "--cache-dir", str(directory))
        progress(f"(c) {mode}: node ready in {time.perf_counter() - started:.1f} s")
        try:
            results = asyncio.run(second_turns(node.url, histories, args.max_tokens))
            rows.append(row("second turn after restart", mode, results, host_tokens(node.url)))
        finally:
            node.stop(check=False)
        progress(f"  {rows[-1]}")
    return rows


def plot(rows: list[dict[str, Any]]) -> None:
    def draw(ax: Any) -> None:
        labels = [r["mode"] for r in rows]
        ax.bar(range(len(rows)), [r["ttft_p50_s"] for r in rows], 0.6, label="p50")
        ax.scatter(range(len(rows)), [r["ttft_p95_s"] for r in rows], color="k", label="p95")
        ax.set(xticks=range(len(rows)), ylabel="TTFT (s)", title="host tier (busy machine)")
        ax.set_xticklabels(labels, rotation=15)
        ax.legend()

    print(f"wrote {save_plot('host_cache', draw, width=7.0)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--ctx", type=int, default=1024, help="small, so the cells overflow")
    parser.add_argument("--conversations", type=int, default=8)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--host-cache-mb", type=int, default=256)
    parser.add_argument("--lengths", default="16,64,256,512", help="crossover prompt lengths")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip", default="", help="parts to skip: a, b, c (comma-separated)")
    args = parser.parse_args()
    args.node_flags = ("--threads", str(args.threads), "--ctx", str(args.ctx))
    skip = set(args.skip.split(","))
    if "a" not in skip:
        lengths = [int(n) for n in args.lengths.split(",")]
        cross = crossover(args.threads, lengths, args.repeats)
        print(f"wrote {write_csv('host_cache_crossover', cross)}")
    rows = []
    if "b" not in skip:
        rows += multi_turn(args)
    if "c" not in skip:
        rows += restart(args)
    if rows:
        report("host_cache", rows)
        plot(rows)


if __name__ == "__main__":
    main()
