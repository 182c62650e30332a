"""Aggregate throughput through one frontend vs. the raw batched ``llama_decode`` ceiling.

In one run: (1) the ceiling: the default model driven by a bare loop of batched
``llama_decode`` + greedy sampling at each batch size, no server; (2) the same model behind a
TinyServe node with ONE frontend, C concurrent streaming clients for each concurrency C:
aggregate generated tok/s, TTFT p50/p95 and inter-token latency p50. Prints both and the ratio.

    .venv/bin/python bench/throughput.py                    # starts its own node
    .venv/bin/python bench/throughput.py --url http://127.0.0.1:8000   # an already running one
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.integration.node import Node

PROMPT = "Write a story about a robot who learns to paint. Once upon a time,"


@dataclass
class Figures:
    tokens: int
    seconds: float
    ttft: list[float]
    itl: list[float]

    @property
    def tok_s(self) -> float:
        return self.tokens / self.seconds


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# -- the ceiling -----------------------------------------------------------------------------


def raw_ceiling(batch: int, prompt_len: int, steps: int, threads: int, ctx: int) -> float:
    """Generated tok/s of a bare loop: prefill ``batch`` prompts, then ``steps`` decode ticks."""
    import llama_cpp

    from tinyserve.model import resolve_model_path

    quiet = llama_cpp.llama_log_callback(lambda *_: None)  # kept alive for the whole run
    llama_cpp.llama_log_set(quiet, ctypes.c_void_p(0))
    mparams = llama_cpp.llama_model_default_params()
    model = llama_cpp.llama_model_load_from_file(str(resolve_model_path(None)).encode(), mparams)
    cparams = llama_cpp.llama_context_default_params()
    cparams.n_ctx, cparams.n_batch, cparams.n_ubatch = ctx, 512, 512
    cparams.n_seq_max, cparams.kv_unified = max(batch, 1), True
    cparams.n_threads = cparams.n_threads_batch = threads
    lctx = llama_cpp.llama_init_from_model(model, cparams)
    lbatch = llama_cpp.llama_batch_init(512, 0, 1)
    samplers = [_greedy() for _ in range(batch)]
    started = time.perf_counter()
    _fill(
        lbatch,
        [
            (t, i, s, i == prompt_len - 1)
            for s in range(batch)
            for i, t in enumerate(range(1000, 1000 + prompt_len))
        ],
    )
    assert llama_cpp.llama_decode(lctx, lbatch) == 0
    rows = [s * prompt_len + prompt_len - 1 for s in range(batch)]
    for step in range(steps):
        tokens = [llama_cpp.llama_sampler_sample(samplers[s], lctx, rows[s]) for s in range(batch)]
        _fill(lbatch, [(tokens[s], prompt_len + step, s, True) for s in range(batch)])
        assert llama_cpp.llama_decode(lctx, lbatch) == 0
        rows = list(range(batch))
    elapsed = time.perf_counter() - started
    llama_cpp.llama_batch_free(lbatch)
    llama_cpp.llama_free(lctx)
    llama_cpp.llama_model_free(model)
    return batch * steps / elapsed


def _greedy() -> int:
    import llama_cpp

    chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
    llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_greedy())
    return chain


def _fill(batch: object, rows: list[tuple[int, int, int, bool]]) -> None:
    b = batch  # the ctypes llama_batch
    for i, (token, pos, seq, logits) in enumerate(rows):
        b.token[i], b.pos[i], b.n_seq_id[i] = token, pos, 1  # type: ignore[attr-defined]
        b.seq_id[i][0], b.logits[i] = seq, logits  # type: ignore[attr-defined]
    b.n_tokens = len(rows)  # type: ignore[attr-defined]


def ceiling_in_subprocess(batch: int, args: argparse.Namespace) -> float:
    """Run ``raw_ceiling`` in a fresh process so its memory and threads are gone afterwards."""
    call = (
        f"raw_ceiling({batch}, {args.prompt_tokens}, {args.max_tokens}, {args.threads}, {args.ctx})"
    )
    code = (
        f"import sys, json; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
        f"import throughput as t; print(json.dumps(t.{call}))"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    return float(json.loads(out.stdout.strip().splitlines()[-1]))


# -- through the server ----------------------------------------------------------------------


async def one_stream(
    session: aiohttp.ClientSession, url: str, max_tokens: int, figures: Figures
) -> None:
    body = {"prompt": PROMPT, "max_tokens": max_tokens, "stream": True}
    sent = time.perf_counter()
    last = sent
    async with session.post(f"{url}/generate", json=body) as resp:
        assert resp.status == 200, await resp.text()
        async for line in resp.content:
            if not line.startswith(b"data:"):
                continue
            event = json.loads(line[5:])
            now = time.perf_counter()
            if event.get("text"):
                (figures.ttft if last == sent else figures.itl).append(now - last)
                last = now
            if event.get("finish_reason"):
                figures.tokens += event["usage"]["completion_tokens"]


async def through_server(url: str, concurrency: int, rounds: int, max_tokens: int) -> Figures:
    figures = Figures(0, 0.0, [], [])
    # NOTE: ttft holds the first gap of each stream (send -> first text), itl the rest.
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:

        async def worker() -> None:
            for _ in range(rounds):
                await one_stream(session, url, max_tokens, figures)

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        figures.seconds = time.perf_counter() - started
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="a running node (default: start one with one frontend)")
    parser.add_argument("--concurrency", default="1,2,4,8,16")
    parser.add_argument("--rounds", type=int, default=2, help="requests per client")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument(
        "--prompt-tokens", type=int, default=16, help="prompt length for the ceiling"
    )
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--ctx", type=int, default=4096)
    parser.add_argument("--slots", type=int, default=8)
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    node = None
    if args.url is None:
        workdir = Path(tempfile.mkdtemp(prefix="tinyserve-bench-"))
        node = Node(
            workdir,
            "--threads",
            str(args.threads),
            "--ctx",
            str(args.ctx),
            "--slots",
            str(args.slots),
            frontends=1,
        ).start()
        args.url = node.url
    print(
        f"llama.cpp threads: {args.threads} (CPUs available: {len(os.sched_getaffinity(0))}); "
        f"slots {args.slots}; max_tokens {args.max_tokens}; {args.rounds} requests per client"
    )
    print(
        f"{'conc':>4} {'ceiling tok/s':>13} {'server tok/s':>12} {'ratio':>6} "
        f"{'TTFT p50':>9} {'TTFT p95':>9} {'ITL p50':>8}"
    )
    try:
        for c in levels:
            ceiling = ceiling_in_subprocess(min(c, args.slots), args)
            fig = asyncio.run(through_server(args.url, c, args.rounds, args.max_tokens))
            print(
                f"{c:>4} {ceiling:>13.1f} {fig.tok_s:>12.1f} {fig.tok_s / ceiling:>6.2f} "
                f"{percentile(fig.ttft, 0.5):>8.3f}s {percentile(fig.ttft, 0.95):>8.3f}s "
                f"{statistics.median(fig.itl) * 1000 if fig.itl else float('nan'):>6.1f}ms",
                flush=True,
            )
    finally:
        if node is not None:
            node.stop(check=False)


if __name__ == "__main__":
    main()
