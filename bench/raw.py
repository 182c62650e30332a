"""The bare llama.cpp figures the server is compared with: one sequence's prefill time by
prompt length (in the same chunks the server uses) and its per-token decode time, on the
default model with no server, run in a child process so its memory and threads are gone
afterwards."""

from __future__ import annotations

import ctypes
import time

from throughput import _fill, _greedy


def raw_single(
    prompt_lens: list[int], out_tokens: int, threads: int, ctx: int, chunk: int
) -> list[dict[str, float]]:
    """For each prompt length: prefill seconds, then the mean seconds of one decode step."""
    import llama_cpp

    from tinyserve.engine.weights import model_params, repack_weights
    from tinyserve.model import resolve_model_path

    quiet = llama_cpp.llama_log_callback(lambda *_: None)  # kept alive for the whole run
    llama_cpp.llama_log_set(quiet, ctypes.c_void_p(0))
    model = llama_cpp.llama_model_load_from_file(
        str(resolve_model_path(None)).encode(), model_params(repack_weights("auto"))
    )
    cparams = llama_cpp.llama_context_default_params()
    cparams.n_ctx, cparams.n_batch, cparams.n_ubatch = ctx, chunk, chunk
    cparams.n_seq_max, cparams.kv_unified = 1, True
    cparams.n_threads = cparams.n_threads_batch = threads
    lctx = llama_cpp.llama_init_from_model(model, cparams)
    lbatch = llama_cpp.llama_batch_init(chunk, 0, 1)
    sampler = _greedy()
    rows = []
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
        rows.append({"prompt": n, "prefill_s": prefill_s,
                     "step_s": (time.perf_counter() - started) / max(out_tokens, 1)})  # fmt: skip
    rows = rows[1:]
    llama_cpp.llama_batch_free(lbatch)
    llama_cpp.llama_free(lctx)
    llama_cpp.llama_model_free(model)
    return rows
