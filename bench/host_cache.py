"""The prefix cache in host memory: what a hit and a store cost, and what it gives a chat.

(a) In-process, no server (``LlamaRuntime`` and ``HostCache`` as ``KvSpace`` drives them),
    for n = 16..2048 tokens, medians of ``--repeats``: prefilling n tokens into a slot,
    against writing them into another slot from the cache (the lookup, their blocks joined
    into one saved state, ``llama_state_seq_set_data``), and storing a finished request's n
    tokens (one ``llama_state_seq_get_data`` of its slot, cut into blocks and hung in the
    tree; the cache is full, so the previous request's blocks are evicted for them). Once per
    n, the next token is decoded in both slots and the two picks compared.
(b) Multi-turn chats on a node with more conversations than slots (8 over ``--slots`` 2), turns
    taken round-robin, one request at a time: by the time a conversation's next turn comes,
    its slot has served others, so its earlier turns come from the prefix cache in host memory
    (``--host-cache-mb``, 2048 by default) or, with ``--host-cache-mb 0``, are prefilled again.
    TTFT p50/p95, prompt tokens reused by tier (``slot``, ``host``) and the time spent
    writing them into slots (``tinyserve_prefix_cache_*``).
(c) Restart: a node with ``--cache-dir`` serves every conversation's first turn and is
    stopped (SIGTERM writes its cache); each conversation's second turn then goes to a node
    started on that directory (warm: tier ``disk``) and to one started on an empty one (cold).

Writes bench/results/host_cache.csv (b, c), host_cache_crossover.csv (a) and host_cache.png.

    .venv/bin/python bench/host_cache.py --threads 1
    .venv/bin/python bench/host_cache.py --skip b,c --lengths 16,256 --repeats 1   # (a), short
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
    scrape,
    start_node,
    stream_request,
    write_csv,
)

BLOCK = 16  # --block-size's default
TIERS = ("slot", "host", "disk")
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
    share less than a block and a slot kept by one serves no other."""
    return f"<|im_start|>system\nVisitor {i} of the day.<|im_end|>\n" + SYSTEM


# -- (a) in-process ------------------------------------------------------------------------


def in_process(threads: int, lengths: list[int], repeats: int) -> list[dict[str, Any]]:
    """Per n: prefill, restore from the cache and store, in milliseconds (medians)."""
    from tinyserve.engine.kv.host_cache import HostCache
    from tinyserve.engine.kv.kv_space import probe_layout
    from tinyserve.engine.runtime.runtime import LlamaRuntime, RuntimeSpec
    from tinyserve.model import resolve_model_path

    # Two slots: one prefilled, one the cache writes into; room for the next token after n.
    spec = RuntimeSpec(resolve_model_path(None), 2, max(lengths) + BLOCK, 512, threads)
    runtime = LlamaRuntime(spec)
    rows = []
    try:
        layout = probe_layout(runtime, BLOCK)
        for n in lengths:
            # Room for one request's n tokens: each store evicts the one before, into rows whose
            # pages were written already, as in a cache that has filled up.
            rows_needed = -(-n // BLOCK)
            cache = HostCache(layout, BLOCK, rows_needed * BLOCK * layout.cell_bytes)
            _one(runtime, cache, n, salt=0)  # warms the arena's pages and llama.cpp's buffers
            runs = [_one(runtime, cache, n, salt=r + 1) for r in range(repeats)]
            prefill, restore, store = ([run[i] for run in runs] for i in range(3))
            row = {
                "tokens": n,
                "prefill_ms": round(percentile(prefill, 0.5) * 1e3, 2),
                "restore_ms": round(percentile(restore, 0.5) * 1e3, 3),
                "store_ms": round(percentile(store, 0.5) * 1e3, 3),
                "kv_kib": round(n * layout.cell_bytes / 1024, 1),
                "same_next_token": _same_next(runtime, n),
            }
            row["prefill_over_restore"] = round(row["prefill_ms"] / max(row["restore_ms"], 1e-3))
            rows.append(row)
            progress(f"(a) {row}")
    finally:
        runtime.close()
    return rows


def _tokens(n: int, salt: int) -> list[int]:
    """``n`` ordinary token ids, distinct per ``salt`` from the first one on."""
    return [1000 + (salt * 7919 + i * 104729) % 40000 for i in range(n)]


def _one(runtime: Any, cache: Any, n: int, salt: int) -> tuple[float, float, float]:
    """Seconds to prefill n tokens into slot 0, to store them (slot 0's state into the
    cache) and to restore them (looked up and written into slot 1)."""
    tokens = _tokens(n, salt)
    runtime.forget(0)
    runtime.forget(1)
    t0 = time.perf_counter()
    for start in range(0, n, 512):
        count = min(512, n - start)
        runtime.batch.clear()
        runtime.batch.add_span(tokens, start, count, start, 0, start + count == n)
        assert runtime.decode() == 0
    t1 = time.perf_counter()
    assert cache.store(tokens, lambda: runtime.save_seq(0)) > 0
    t2 = time.perf_counter()
    hit = cache.lookup([*tokens, 7])  # a prompt that goes on after them: all n are usable
    assert hit.n_tokens == n, (hit.n_tokens, n)
    assert cache.restore(hit, lambda state: runtime.load_seq(1, state)), "llama.cpp refused it"
    t3 = time.perf_counter()
    return t1 - t0, t3 - t2, t2 - t1


def _same_next(runtime: Any, n: int) -> bool:
    """After the last ``_one``: whether slot 0 (prefilled) and slot 1 (restored) pick the same
    token after one more, decoded in both at position n."""
    batch = runtime.batch
    batch.clear()
    rows = [batch.add(7, n, slot, True) for slot in (0, 1)]
    assert runtime.decode() == 0
    picks = [int(runtime.logits(row).argmax()) for row in rows]
    return picks[0] == picks[1]


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


def row(case: str, mode: str, results: list[Result], url: str) -> dict[str, Any]:
    """The results of one node's turns, with its prefix-cache figures from /metrics."""
    ttft = [r.ttft for r in results if r.ttft is not None]
    prompt = sum(r.prompt_tokens for r in results)
    cached = sum(r.cached_tokens for r in results)
    metrics = scrape(url)
    hit = "tinyserve_prefix_cache_hit_tokens_total"
    restore_s = metrics.get("tinyserve_prefix_cache_restore_seconds_total", 0.0)
    return {
        "case": case,
        "mode": mode,
        "requests": len(results),
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        **{f"{tier}_tokens": int(metrics.get(f'{hit}{{tier="{tier}"}}', 0)) for tier in TIERS},
        "restore_ms": round(restore_s * 1e3, 1),
        "cached_share": round(cached / prompt, 3) if prompt else 0,
        "ttft_p50_s": round(percentile(ttft, 0.5), 3),
        "ttft_p95_s": round(percentile(ttft, 0.95), 3),
    }


def multi_turn(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    modes = (("host cache off (0 MB)", "0"), (f"host cache {args.host_cache_mb} MB", None))
    for mode, mb in modes:
        progress(f"(b) {mode}")
        size = ("--host-cache-mb", mb or str(args.host_cache_mb))
        node = start_node(*args.node_flags, *size)
        try:
            results = asyncio.run(chats(node.url, args.conversations, args.turns, args.max_tokens))
            rows.append(row("multi-turn", mode, results, node.url))
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
            rows.append(row("second turn after restart", mode, results, node.url))
        finally:
            node.stop(check=False)
        progress(f"  {rows[-1]}")
    return rows


def plot(rows: list[dict[str, Any]], cost: list[dict[str, Any]]) -> None:
    panels = [p for p, there in (("cost", cost), ("ttft", rows)) if there]

    def draw(axes: Any) -> None:
        for ax, panel in zip(axes if len(panels) > 1 else [axes], panels, strict=True):
            if panel == "cost":
                n = [r["tokens"] for r in cost]
                for key, label in (("prefill_ms", "prefill"), ("restore_ms", "write from cache"),
                                   ("store_ms", "store in cache")):  # fmt: skip
                    ax.plot(n, [r[key] for r in cost], "o-", label=label)
                ax.set(xscale="log", yscale="log", xlabel="tokens", ylabel="ms",
                       title="a prefix: prefill, write from host memory, store")  # fmt: skip
            else:
                labels = [r["mode"] for r in rows]
                ax.bar(range(len(rows)), [r["ttft_p50_s"] for r in rows], 0.6, label="p50")
                ax.scatter(range(len(rows)), [r["ttft_p95_s"] for r in rows], color="k",
                           label="p95")  # fmt: skip
                ax.set(xticks=range(len(rows)), ylabel="TTFT (s)", title="turns")
                ax.set_xticklabels(labels, rotation=15)
            ax.legend()

    print(f"wrote {save_plot('host_cache', draw, panels=len(panels))}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--slots", type=int, default=2, help="fewer than the conversations")
    parser.add_argument("--ctx-per-slot", type=int, default=1024)
    parser.add_argument("--conversations", type=int, default=8)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--host-cache-mb", type=int, default=2048, help="(b)'s cache on")
    parser.add_argument("--lengths", default="16,64,256,1024,2048", help="(a)'s token counts")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip", default="", help="parts to skip: a, b, c (comma-separated)")
    args = parser.parse_args()
    args.node_flags = ("--threads", str(args.threads), "--slots", str(args.slots),
                       "--ctx-per-slot", str(args.ctx_per_slot))  # fmt: skip
    skip = set(args.skip.split(","))
    cost = []
    if "a" not in skip:
        lengths = [int(n) for n in args.lengths.split(",")]
        cost = in_process(args.threads, lengths, args.repeats)
        print(f"wrote {write_csv('host_cache_crossover', cost)}")
    rows = []
    if "b" not in skip:
        rows += multi_turn(args)
    if "c" not in skip:
        rows += restart(args)
    if rows:
        report("host_cache", rows)
    if rows or cost:
        plot(rows, cost)


if __name__ == "__main__":
    main()
