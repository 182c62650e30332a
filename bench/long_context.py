"""Long prompts up to a slot's context: admission, engine memory, prefill speed by length,
and the refusals at the edge.

A node with two slots of ``--ctx-per-slot`` cells each (8192 by default: the default model's
training context, and the 16384 cells two slots shared in one pool before issue 32). Prompts
are token-id lists sent to ``/v1/completions`` (so their length is exact) with ``max_tokens``
1: the reply time is the prefill plus one token, so prompt tokens / reply time is the prefill
speed. For each length the engine's resident memory (VmRSS) is read after the request. At the
edge, a prompt with ``prompt + max_tokens == ctx-per-slot`` must be admitted (a streamed
request: its 200 and headers come once the engine accepted it; the client then leaves, which
cancels it) and one token more refused with a 400 ``context_length_exceeded``. Writes
bench/results/long_context_<ctx-per-slot>.csv and .png.

    .venv/bin/python bench/long_context.py                          # --ctx-per-slot 8192
    .venv/bin/python bench/long_context.py --lengths 512,2048             # short
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

from common import get_json, post_json, progress, report, save_plot, start_node, wait_idle


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def ids(n: int, salt: int) -> list[int]:
    """``n`` token ids (ordinary vocabulary entries), distinct per ``salt`` from the start."""
    return [1000 + (salt * 7919 + i * 104729) % 40000 for i in range(n)]


def complete(
    url: str, model: str, prompt: list[int], max_tokens: int, stream: bool = False
) -> tuple[int, Any, float]:
    """A completion; with ``stream`` only until the reply's headers (the request was admitted
    or refused), then the connection closes and the node cancels it: the edge cases need not
    pay for a whole-context prefill."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "stream": stream}  # fmt: skip
    started = time.perf_counter()
    status, reply = post_json(f"{url}/v1/completions", body, headers_only=stream)
    return status, reply, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ctx-per-slot", type=int, default=8192)
    parser.add_argument("--lengths", default="512,2048,4096,6144,8000")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    args = parser.parse_args()
    ctx = args.ctx_per_slot
    flags = ["--ctx-per-slot", str(ctx), "--slots", "2", "--threads", str(args.threads)]
    flags += ["--chunk", "512", "--max-batch-tokens", "512"]
    flags += ["--max-tokens-limit", str(ctx), "--max-body-bytes", str(8 * 1024**2)]
    node = start_node(*flags)
    rows = []
    try:
        model = get_json(f"{node.url}/v1/models")["data"][0]["id"]
        pid = node.engine_pid()
        idle = {"case": "idle", "prompt_tokens": 0, "status": "", "reason": "", "seconds": 0.0}
        rows.append({**idle, "prefill_tok_s": None, "engine_rss_mib": round(rss_mib(pid), 1)})
        lengths = [int(x) for x in args.lengths.split(",")]
        cases = [("length", n, 1) for n in lengths]
        cases += [("edge: prompt + max_tokens = ctx-per-slot", ctx - 4, 4)]
        cases += [("edge: one token over", ctx - 3, 4)]
        for salt, (case, n, max_tokens) in enumerate(cases):
            edge = case.startswith("edge")
            status, reply, seconds = complete(node.url, model, ids(n, salt), max_tokens, edge)
            reason = reply.get("error", {}).get("code", "") if status != 200 else ""
            served = status == 200
            rows.append({
                "case": case,
                "prompt_tokens": n,
                "status": status,
                "reason": reason,
                "seconds": round(seconds, 2),
                "prefill_tok_s": round(n / seconds, 1) if served and max_tokens == 1 else None,
                "engine_rss_mib": round(rss_mib(pid), 1),
            })  # fmt: skip
            progress(f"{case} {n}: {rows[-1]}")
            wait_idle(node)
    finally:
        node.stop(check=False)
    served = [r for r in rows if r["prefill_tok_s"]]
    report(f"long_context_{ctx}", rows)

    def draw(axes: list[Any]) -> None:
        left, right = axes
        x = [r["prompt_tokens"] for r in served]
        left.plot(x, [r["prefill_tok_s"] for r in served], "o-")
        left.set(
            xlabel="prompt tokens", ylabel="tok/s", title=f"prefill speed (--ctx-per-slot {ctx})"
        )
        right.plot(x, [r["engine_rss_mib"] for r in served], "o-")
        right.set(xlabel="prompt tokens", ylabel="MiB", title="engine resident memory after")

    print(f"wrote {save_plot(f'long_context_{ctx}', draw, panels=2)}")


if __name__ == "__main__":
    main()
