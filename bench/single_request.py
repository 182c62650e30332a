"""One request at a time: what the server adds to llama.cpp's own prefill and decode time.

For each prompt length and output length, ``--reps`` streaming requests, one at a time, to a
node with one slot (each prompt distinct, so the prefix cache cannot help): TTFT, inter-token
latency (ITL) p50 and total time as the client sees them. In the same run a child process
drives the same model with bare ``llama_decode`` calls (same chunk size, same threads):
prefill time of the same prompt length and the mean decode step. The overhead columns are
the server's figure minus the bare one. Each request asks for its timeline, which splits its
TTFT: the engine's ``llama_decode`` calls of the prompt (``engine_prefill_ms``, to set
against the bare prefill), the engine's first-token stamp (``engine_first_ms``, from the
frontend's arrival) and the rest, the way back to the client (``delivery_ms``). Writes
bench/results/single_request.csv and .png.

    .venv/bin/python bench/single_request.py                          # 16..3500 tokens
    .venv/bin/python bench/single_request.py --prompts 16,512 --outputs 32 --reps 2  # short
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
from typing import Any

import aiohttp
from common import (
    Result,
    in_fresh_process,
    percentile,
    progress,
    prompt_of,
    report,
    save_plot,
    start_node,
    stream_request,
    wait_idle,
)


async def measure(url: str, prompt: str, max_tokens: int) -> Result:
    body = {"prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "timeline": True}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=900)) as session:
        return await stream_request(session, url, body)


def engine_split(results: list[Result]) -> dict[str, float]:
    """Medians of what the timelines say: prefill decode time and the first-token stamp."""
    timelines = [r.timeline for r in results if r.timeline]
    prefill = [sum(c["decode_ms"] for c in t.get("prefill", [])) for t in timelines]
    first = [t["first_token_ms"] for t in timelines if t.get("first_token_ms") is not None]
    return {
        "engine_prefill_ms": round(statistics.median(prefill), 1) if prefill else float("nan"),
        "engine_first_ms": round(statistics.median(first), 1) if first else float("nan"),
    }


def row_of(target: int, out: int, results: list[Result], raw: dict[str, float]) -> dict[str, Any]:
    ttft = statistics.median(r.ttft for r in results if r.ttft is not None)
    split = engine_split(results)
    gaps = [g for r in results for g in r.gaps]
    itl = percentile(gaps, 0.5)
    return {
        "prompt_target": target,
        "prompt_tokens": results[0].prompt_tokens,
        "output_tokens": out,
        "ttft_s": round(ttft, 4),
        "raw_prefill_s": round(raw["prefill_s"], 4),
        "ttft_overhead_ms": round((ttft - raw["prefill_s"]) * 1e3, 1),
        **split,
        "delivery_ms": round(ttft * 1e3 - split["engine_first_ms"], 1),
        "itl_p50_ms": round(itl * 1e3, 2),
        "raw_step_ms": round(raw["step_s"] * 1e3, 2),
        "itl_overhead_ms": round((itl - raw["step_s"]) * 1e3, 2),
        "total_s": round(statistics.median(r.seconds for r in results), 3),
    }


def plot(rows: list[dict[str, Any]]) -> None:
    def draw(axes: list[Any]) -> None:
        left, right = axes
        for out in sorted({r["output_tokens"] for r in rows}):
            mine = [r for r in rows if r["output_tokens"] == out]
            x = [r["prompt_tokens"] for r in mine]
            left.plot(x, [r["ttft_s"] for r in mine], "o-", label=f"server TTFT (out {out})")
            right.plot(x, [r["itl_p50_ms"] for r in mine], "o-", label=f"server ITL (out {out})")
        first = [r for r in rows if r["output_tokens"] == rows[0]["output_tokens"]]
        x = [r["prompt_tokens"] for r in first]
        left.plot(x, [r["raw_prefill_s"] for r in first], "k--", label="bare prefill")
        right.plot(x, [r["raw_step_ms"] for r in first], "k--", label="bare decode step")
        left.set(xlabel="prompt tokens", ylabel="seconds", title="time to first token")
        right.set(xlabel="prompt tokens", ylabel="ms", title="inter-token latency p50")
        left.legend()
        right.legend()

    print(f"wrote {save_plot('single_request', draw, panels=2)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", default="16,128,512,1024,2048,3500")
    parser.add_argument("--outputs", default="16,128")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--chunk", type=int, default=256)
    args = parser.parse_args()
    prompts = [int(x) for x in args.prompts.split(",")]
    outputs = [int(x) for x in args.outputs.split(",")]
    flags = ["--threads", str(args.threads), "--slots", "1", "--ctx-per-slot", "4096"]
    flags += ["--chunk", str(args.chunk), "--max-batch-tokens", str(args.chunk)]
    node = start_node(*flags)
    measured: dict[tuple[int, int], list[Result]] = {}
    try:
        salt = 0
        for out in outputs:
            for target in prompts:
                runs = []
                for _ in range(args.reps):
                    salt += 1
                    runs.append(asyncio.run(measure(node.url, prompt_of(target, salt), out)))
                    assert runs[-1].status == 200, runs[-1].reason
                    wait_idle(node)
                measured[(target, out)] = runs
                progress(f"server: prompt ~{target} output {out}: {len(runs)} requests done")
    finally:
        node.stop(check=False)
    lengths = sorted({rs[0].prompt_tokens for rs in measured.values()})
    progress(f"bare llama_decode for prompts {lengths}")
    bare = {
        r["prompt"]: r
        for r in in_fresh_process(
            "raw", "raw_single", lengths, max(outputs), args.threads, 4096, args.chunk
        )
    }
    rows = [row_of(t, o, rs, bare[rs[0].prompt_tokens]) for (t, o), rs in measured.items()]
    report("single_request", rows)
    plot(rows)


if __name__ == "__main__":
    main()
