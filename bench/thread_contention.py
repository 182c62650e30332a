"""What one busy process beside llama.cpp costs its prefill and decode, by thread count and
OpenMP wait policy: the engine's threads spin at every barrier of a graph, and a thread that
lost its core holds up the others.

Each configuration runs in a fresh process (OpenMP reads its environment at start): the
default model with ``--ctx`` cells, ``--chunks`` prefill chunks of 128 tokens, then
``--decodes`` single-token decodes; then the same with a busy loop on one core beside it.

    .venv/bin/python bench/thread_contention.py
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

CONFIGS = [("2", {}), ("1", {}), ("2", {"OMP_WAIT_POLICY": "passive"})]


def measure(threads: int, chunks: int, decodes: int) -> None:
    """In this process: prefill tokens a second and decode ms a token, printed."""
    import llama_cpp

    from tinyserve.engine.runtime.weights import model_params, repack_weights
    from tinyserve.model import resolve_model_path

    quiet = llama_cpp.llama_log_callback(lambda *_: None)
    llama_cpp.llama_log_set(quiet, None)
    llama_cpp.llama_backend_init()
    path = str(resolve_model_path(None)).encode()
    model = llama_cpp.llama_model_load_from_file(path, model_params(repack_weights("auto")))
    params = llama_cpp.llama_context_default_params()
    params.n_ctx, params.n_batch, params.n_ubatch = 4096, 512, 512
    params.n_threads = params.n_threads_batch = threads
    ctx = llama_cpp.llama_init_from_model(model, params)
    batch = llama_cpp.llama_batch_init(512, 0, 1)
    pos = 0

    def decode(n: int) -> None:
        nonlocal pos
        batch.n_tokens = n
        for i in range(n):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = 1000 + pos % 500, pos, 1
            batch.seq_id[i][0], batch.logits[i] = 0, i == n - 1
            pos += 1
        assert llama_cpp.llama_decode(ctx, batch) == 0

    started = time.perf_counter()
    for _ in range(chunks):
        decode(128)
    prefill = 128 * chunks / (time.perf_counter() - started)
    started = time.perf_counter()
    for _ in range(decodes):
        decode(1)
    per_token = (time.perf_counter() - started) / decodes * 1e3
    print(f"{prefill:8.0f} {per_token:10.1f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, default=8)
    parser.add_argument("--decodes", type=int, default=64)
    parser.add_argument("--measure", type=int, help=argparse.SUPPRESS)  # the child's threads
    args = parser.parse_args()
    if args.measure:
        measure(args.measure, args.chunks, args.decodes)
        return
    print("threads  wait policy  busy loop  prefill tok/s  decode ms/token")
    for busy in (False, True):
        hog = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
        try:
            for threads, env in CONFIGS:
                argv = [sys.executable, __file__, "--measure", threads,
                        "--chunks", str(args.chunks), "--decodes", str(args.decodes)]  # fmt: skip
                out = subprocess.run(argv, env={**os.environ, **env}, capture_output=True,
                                     text=True, check=True).stdout.split()  # fmt: skip
                policy = env.get("OMP_WAIT_POLICY", "spin")
                print(f"{threads:>7}  {policy:>11}  {'yes' if busy else 'no':>9}  "
                      f"{out[-2]:>13}  {out[-1]:>15}", flush=True)  # fmt: skip
        finally:
            if hog is not None:
                hog.kill()


if __name__ == "__main__":
    main()
