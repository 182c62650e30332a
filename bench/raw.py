"""The bare llama.cpp figures the server is compared with: one sequence's prefill time by
prompt length (in the same chunks the server uses) and its per-token decode time, on the
default model with no server, run in a child process so its memory and threads are gone
afterwards."""

from __future__ import annotations

import time

from throughput import _fill, _greedy, bare_llama


def raw_single(
    prompt_lens: list[int], out_tokens: int, threads: int, ctx: int, chunk: int
) -> list[dict[str, float]]:
    """For each prompt length: prefill seconds, then the mean seconds of one decode step."""
    import llama_cpp

    rows = []
    with bare_llama(ctx, chunk, 1, True, threads) as (lctx, lbatch):
        sampler = _greedy()
        for n in [16, *prompt_lens]:  # the first pass warms up (weights paged in, threads up)
            llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(lctx), True)
            prompt = [1000 + (i * 7919) % 20000 for i in range(n)]
            started = time.perf_counter()
            for start in range(0, n, chunk):
                piece = prompt[start : start + chunk]
                last = start + len(piece) == n
                _fill(lbatch, [(t, start + i, 0, last and i == len(piece) - 1)
                               for i, t in enumerate(piece)])  # fmt: skip
                assert llama_cpp.llama_decode(lctx, lbatch) == 0
            token = llama_cpp.llama_sampler_sample(sampler, lctx, -1)
            prefill_s = time.perf_counter() - started
            started = time.perf_counter()
            for step in range(out_tokens):
                _fill(lbatch, [(token, n + step, 0, True)])
                assert llama_cpp.llama_decode(lctx, lbatch) == 0
                token = llama_cpp.llama_sampler_sample(sampler, lctx, -1)
            step_s = (time.perf_counter() - started) / max(out_tokens, 1)
            rows.append({"prompt": n, "prefill_s": prefill_s, "step_s": step_s})
    return rows[1:]
