"""Decode tail latency while long prompts arrive, for chunked prefill sizes from off to small.

For each ``--chunks`` setting a fresh node (``off``: the whole prompt in one tick, i.e.
``--chunk 4096``, more than any long prompt; otherwise ``--chunk C``; the tick budget is the
chunk plus one row per slot) serves ``--decoders`` streams that decode steadily
(``ignore_eos``) while ``--long`` prompts of 1-3k tokens arrive ``--gap`` seconds apart. Counted
from the first long prompt's arrival to the last one's first token: the inter-token latency
p50/p99/max of the decoding streams and the long prompts' TTFT. Writes
bench/results/tail_latency.csv and .png.

    .venv/bin/python bench/tail_latency.py                                    # full
    .venv/bin/python bench/tail_latency.py --chunks off,256,32 --long 2 --sizes 600,1200  # short
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
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
    save_plot,
    start_node,
    stream_request,
    write_csv,
)

# A slot's cells: room for a decoder's (16 + 1500 tokens) and the longest prompt's worst case;
# the decoders and the long prompts' slot take 5 x 3072 cells, about the 16384 one pool had.
CTX_PER_SLOT = 3072
WHOLE = 4096  # 'off': a chunk larger than any long prompt, so each goes in one tick


async def window(url: str, args: argparse.Namespace) -> tuple[list[float], list[Result]]:
    """The decoders' token gaps inside the window, and the long prompts' results."""
    times: list[list[float]] = [[] for _ in range(args.decoders)]
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=900)) as session:
        decoders = [
            asyncio.create_task(
                stream_request(
                    session,
                    url,
                    {"prompt": prompt_of(16, i), "max_tokens": 1500, "ignore_eos": True},
                    text_times=times[i],
                )
            )
            for i in range(args.decoders)
        ]
        while not all(len(t) >= 3 for t in times):  # every decoder streams
            failed = [d.result() for d in decoders if d.done()]
            assert not failed, f"a decoder ended before the window: {failed}"
            await asyncio.sleep(0.05)
        started = time.perf_counter()  # the clock stream_request stamps with
        longs = []
        for i in range(args.long):
            size = args.sizes[i % len(args.sizes)]
            body = {"prompt": prompt_of(size, 1000 + i), "max_tokens": 4}
            longs.append(asyncio.create_task(stream_request(session, url, body)))
            await asyncio.sleep(args.gap)
        results = await asyncio.gather(*longs)
        ended = time.perf_counter()
        for task in decoders:
            task.cancel()
        await asyncio.gather(*decoders, return_exceptions=True)
    gaps = [b - a for t in times for a, b in itertools.pairwise(t) if started <= b <= ended]
    return gaps, list(results)


def node_flags(chunk: str, slots: int, threads: int) -> list[str]:
    size = WHOLE if chunk == "off" else int(chunk)
    budget = size + slots
    return ["--ctx-per-slot", str(CTX_PER_SLOT), "--slots", str(slots), "--threads", str(threads),
            "--chunk", str(size), "--max-batch-tokens", str(budget)]  # fmt: skip


def run_one(chunk: str, args: argparse.Namespace) -> dict[str, Any]:
    node = start_node(*node_flags(chunk, args.decoders + 1, args.threads))
    try:
        gaps, longs = asyncio.run(window(node.url, args))
    finally:
        node.stop(check=False)
    assert all(r.status == 200 for r in longs), [r.reason for r in longs]
    ttft = [r.ttft for r in longs if r.ttft is not None]
    return {
        "chunk": chunk,
        "decode_gaps": len(gaps),
        "itl_p50_ms": round(percentile(gaps, 0.5) * 1e3, 1),
        "itl_p99_ms": round(percentile(gaps, 0.99) * 1e3, 1),
        "itl_max_ms": round(max(gaps, default=float("nan")) * 1e3, 1),
        "long_prompt_tokens": "/".join(str(r.prompt_tokens) for r in longs),
        "long_ttft_mean_s": round(mean(ttft), 2),
        "long_ttft_max_s": round(max(ttft, default=float("nan")), 2),
    }


def plot(rows: list[dict[str, Any]]) -> None:
    def draw(axes: list[Any]) -> None:
        left, right = axes
        names = [str(r["chunk"]) for r in rows]
        x = range(len(rows))
        left.bar([i - 0.2 for i in x], [r["itl_p50_ms"] for r in rows], 0.4, label="p50")
        left.bar([i + 0.2 for i in x], [r["itl_p99_ms"] for r in rows], 0.4, label="p99")
        left.set(xticks=list(x), xticklabels=names, xlabel="--chunk", ylabel="ms",
                 title="decoding streams' inter-token latency")  # fmt: skip
        right.bar(x, [r["long_ttft_mean_s"] for r in rows], 0.6)
        right.set(xticks=list(x), xticklabels=names, xlabel="--chunk", ylabel="s",
                  title="long prompts' mean TTFT")  # fmt: skip
        left.legend()

    print(f"wrote {save_plot('tail_latency', draw, panels=2)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chunks", default="off,1024,256,64,16")
    parser.add_argument("--decoders", type=int, default=4)
    parser.add_argument("--long", type=int, default=6, help="long prompts per setting")
    parser.add_argument("--gap", type=float, default=3.0, help="seconds between long prompts")
    parser.add_argument("--sizes", default="1000,3000,2000", help="long prompts' tokens, cycled")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    args = parser.parse_args()
    args.sizes = [int(x) for x in args.sizes.split(",")]
    rows = []
    for chunk in args.chunks.split(","):
        rows.append(run_one(chunk, args))
        progress(f"chunk {chunk}: {rows[-1]}")
    print(f"wrote {write_csv('tail_latency', rows)}")
    plot(rows)


if __name__ == "__main__":
    main()
