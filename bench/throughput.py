"""Aggregate throughput through one frontend vs. the raw batched ``llama_decode`` ceiling.

In one run: (1) the ceiling: the default model driven by a bare loop of batched
``llama_decode`` + greedy sampling at each batch size, no server, with the node's KV layout
(``--ctx-per-slot`` cells per sequence, each attending over its own); (2) the same model behind a
TinyServe node with ONE frontend, C concurrent streaming clients for each concurrency C:
aggregate generated tok/s, TTFT p50/p95 and inter-token latency p50. Prints both and the ratio.

    .venv/bin/python bench/throughput.py
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import os
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import aiohttp
from common import (
    Result,
    in_fresh_process,
    percentile,
    start_node,
    stream_request,
    write_csv,
)

PROMPT = "Write a story about a robot who learns to paint. Once upon a time,"


@contextmanager
def bare_llama(
    n_ctx: int, n_batch: int, n_seq_max: int, unified: bool, threads: int, flash_attn: str = "auto"
) -> Iterator[tuple[Any, Any]]:
    """The default model in a bare llama.cpp context, with no server: ``(context, batch)``, a
    batch of ``n_batch`` rows, freed on exit. llama.cpp's logs are off; weights are repacked
    and flash attention chosen as the engine decides (``--repack``, ``--flash-attn``: ``auto``
    unless ``flash_attn`` says otherwise); ``n_ubatch`` is ``n_batch``."""
    import llama_cpp

    from tinyserve.engine.runtime.weights import (
        GpuSpec,
        flash_attention,
        model_params,
        repack_weights,
    )
    from tinyserve.model import resolve_model_path

    quiet = llama_cpp.llama_log_callback(lambda *_: None)  # kept alive for the whole run
    llama_cpp.llama_log_set(quiet, ctypes.c_void_p(0))
    mparams = model_params(repack_weights("auto"))
    model = llama_cpp.llama_model_load_from_file(str(resolve_model_path(None)).encode(), mparams)
    cparams = llama_cpp.llama_context_default_params()
    cparams.n_ctx, cparams.n_batch, cparams.n_ubatch = n_ctx, n_batch, n_batch
    cparams.n_seq_max, cparams.kv_unified = n_seq_max, unified
    cparams.n_threads = cparams.n_threads_batch = threads
    cparams.flash_attn_type = flash_attention(flash_attn, "f16", GpuSpec())
    lctx = llama_cpp.llama_init_from_model(model, cparams)
    lbatch = llama_cpp.llama_batch_init(n_batch, 0, 1)
    try:
        yield lctx, lbatch
    finally:
        llama_cpp.llama_batch_free(lbatch)
        llama_cpp.llama_free(lctx)
        llama_cpp.llama_model_free(model)


def raw_ceiling(
    batch: int,
    prompt_len: int,
    steps: int,
    threads: int,
    ctx: int,
    unified: bool = False,
    parked: int = 0,
) -> float:
    """Generated tok/s of a bare loop: prefill ``batch`` prompts, then ``steps`` decode ticks.

    ``ctx`` cells in all. Not ``unified`` (the default): llama.cpp gives each sequence
    ``ctx / batch`` cells of its own (llama-server's default, TinyServe's layout since issue
    32); ``unified``: one pool of cells for all sequences (TinyServe's layout before).
    ``parked``: cells held first by one more sequence that never decodes, below the running
    ones (as a parked prefix holds them in a unified cache); not timed."""
    import llama_cpp

    n_seq_max = max(batch, 1) + (1 if parked else 0)
    with bare_llama(ctx, 512, n_seq_max, unified, threads) as (lctx, lbatch):
        fill_context(lctx, lbatch, batch, parked)
        samplers = [_greedy() for _ in range(batch)]
        started = time.perf_counter()
        prompt = [
            (t, i, s, i == prompt_len - 1)
            for s in range(batch)
            for i, t in enumerate(range(1000, 1000 + prompt_len))
        ]
        _fill(lbatch, prompt)
        assert llama_cpp.llama_decode(lctx, lbatch) == 0
        rows = [s * prompt_len + prompt_len - 1 for s in range(batch)]
        for step in range(steps):
            tokens = [
                llama_cpp.llama_sampler_sample(samplers[s], lctx, rows[s]) for s in range(batch)
            ]
            _fill(lbatch, [(tokens[s], prompt_len + step, s, True) for s in range(batch)])
            assert llama_cpp.llama_decode(lctx, lbatch) == 0
            rows = list(range(batch))
        elapsed = time.perf_counter() - started
    return batch * steps / elapsed


def _greedy() -> Any:
    import llama_cpp

    chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
    llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_greedy())
    return chain


def _fill(batch: Any, rows: list[tuple[int, int, int, bool]]) -> None:
    for i, (token, pos, seq, logits) in enumerate(rows):
        batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, pos, 1
        batch.seq_id[i][0], batch.logits[i] = seq, logits
    batch.n_tokens = len(rows)


def fill_context(lctx: Any, lbatch: Any, seq: int, n_tokens: int) -> None:
    """Decode ``n_tokens`` filler tokens into sequence ``seq`` at positions 0.., 512 a decode
    (``lbatch`` holds 512 rows), no logits: a context to time steps on, not itself timed."""
    import llama_cpp

    for start in range(0, n_tokens, 512):
        n = min(512, n_tokens - start)
        _fill(lbatch, [(1000 + (start + i) % 500, start + i, seq, False) for i in range(n)])
        assert llama_cpp.llama_decode(lctx, lbatch) == 0


def ceiling_in_subprocess(batch: int, args: argparse.Namespace) -> float:
    """Run ``raw_ceiling`` in a fresh process so its memory and threads are gone afterwards:
    ``batch`` sequences of ``args.ctx_per_slot`` cells each."""
    ctx = batch * args.ctx_per_slot
    numbers = (batch, args.prompt_tokens, args.max_tokens, args.threads, ctx)
    return float(in_fresh_process("throughput", "raw_ceiling", *numbers))


async def through_server(
    url: str, concurrency: int, rounds: int, max_tokens: int
) -> tuple[float, list[Result]]:
    """C closed-loop clients, ``rounds`` requests each: (wall seconds, every result)."""
    body = {"prompt": PROMPT, "max_tokens": max_tokens}
    results: list[Result] = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:

        async def client() -> None:
            for _ in range(rounds):
                results.append(await stream_request(session, url, body))

        started = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        return time.perf_counter() - started, results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", default="1,2,4,8,16")
    parser.add_argument("--rounds", type=int, default=2, help="requests per client")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--prompt-tokens", type=int, default=16, help="ceiling's prompt length")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    # PROMPT and a --max-tokens up to ~490 fit; 8 slots of it: the 4096 cells one pool had.
    parser.add_argument("--ctx-per-slot", type=int, default=512)
    parser.add_argument("--slots", type=int, default=8)
    args = parser.parse_args()
    node = start_node(
        "--threads",
        str(args.threads),
        "--ctx-per-slot",
        str(args.ctx_per_slot),
        "--slots",
        str(args.slots),
        "--max-queue",
        "256",
        frontends=1,
    )
    print(
        f"llama.cpp threads: {args.threads} (CPUs available: {len(os.sched_getaffinity(0))}); "
        f"slots {args.slots}; max_tokens {args.max_tokens}; {args.rounds} requests per client; "
        "one frontend"
    )
    print(
        f"{'conc':>4} {'ceiling tok/s':>13} {'server tok/s':>12} {'ratio':>6} "
        f"{'TTFT p50':>9} {'TTFT p95':>9} {'ITL p50':>8}"
    )
    rows = []
    try:
        for c in [int(x) for x in args.concurrency.split(",")]:
            ceiling = ceiling_in_subprocess(min(c, args.slots), args)
            seconds, results = asyncio.run(
                through_server(node.url, c, args.rounds, args.max_tokens)
            )
            assert all(r.status == 200 for r in results), [r.reason for r in results]
            tok_s = sum(r.tokens for r in results) / seconds
            ttft = [r.ttft for r in results if r.ttft is not None]
            gaps = [g for r in results for g in r.gaps]
            row = {
                "concurrency": c,
                "ceiling_tok_s": round(ceiling, 1),
                "server_tok_s": round(tok_s, 1),
                "ratio": round(tok_s / ceiling, 3),
                "ttft_p50_s": round(percentile(ttft, 0.5), 3),
                "ttft_p95_s": round(percentile(ttft, 0.95), 3),
                "itl_p50_ms": round(statistics.median(gaps) * 1000, 1) if gaps else None,
            }
            rows.append(row)
            print(
                f"{c:>4} {ceiling:>13.1f} {tok_s:>12.1f} {tok_s / ceiling:>6.2f} "
                f"{row['ttft_p50_s']:>8.3f}s {row['ttft_p95_s']:>8.3f}s "
                f"{row['itl_p50_ms']:>6.1f}ms",
                flush=True,
            )
    finally:
        node.stop(check=False)
    print(f"wrote {write_csv('throughput', rows)}")


if __name__ == "__main__":
    main()
