"""What a decode step costs by the KV layout: bare llama.cpp, and TinyServe's engine on it.

llama.cpp attends each row of a step over the cells up to the highest one in use (rounded up
to 256). In one unified pool that span covers every running sequence and anything held below
them; with a pool per sequence (llama-server's default, ``-np N`` without ``-kvu``, and
TinyServe's only layout since issue 32) each row attends over its own sequence's cells only.
The same work each time (B prompts, then greedy decode steps), one fresh process per run, the
layouts in rotating order over the rounds:

- ``per-seq``: bare llama.cpp, ``kv_unified = false``, ``--ctx-per-slot`` cells per sequence;
- ``unified``: bare llama.cpp, one pool, the running sequences packed from cell 0;
- ``unified+N``: one pool with N cells held below them by a sequence that never decodes;
- ``tinyserve``: TinyServe's ``EngineCore`` in-process (no sockets), ``--slots B`` and
  ``--ctx-per-slot``, the same prompts and steps as requests with ``max_tokens`` = steps:
  the layout plus the engine's own work per step, against ``per-seq``.

    .venv/bin/python bench/kv_span.py --batch 8 --steps 480 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from common import in_fresh_process, write_csv


def engine_rate(batch: int, prompt_len: int, steps: int, threads: int, cells: int) -> float:
    """Generated tok/s of ``EngineCore``: ``batch`` requests of ``prompt_len`` tokens and
    ``steps`` greedy tokens each, submitted at once, stepped until all are done."""
    from tinyserve import protocol
    from tinyserve.config import build_config
    from tinyserve.engine.core import EngineCore
    from tinyserve.engine.runtime.runtime import LlamaRuntime, RuntimeSpec

    settings = {"slots": batch, "ctx_per_slot": cells, "threads": threads, "log_level": "error"}
    config = build_config(settings, environ={})
    core = EngineCore(config, LlamaRuntime(RuntimeSpec.from_config(config)))
    sampling = protocol.SamplingParams(temperature=0.0, ignore_eos=True)
    started = time.perf_counter()
    for s in range(batch):
        prompt = list(range(1000, 1000 + prompt_len))  # the same prompts as raw_ceiling's
        request = protocol.Submit(f"r{s}", "f" * 32, prompt, sampling, steps)
        core.submit(request)
    while core.has_work():
        core.step()
    return batch * steps / (time.perf_counter() - started)


def run_in_subprocess(args: argparse.Namespace, layout: str, parked: int) -> float:
    if layout == "tinyserve":
        numbers = (args.batch, args.prompt_tokens, args.steps, args.threads, args.ctx_per_slot)
        return float(in_fresh_process("kv_span", "engine_rate", *numbers))
    ctx = args.batch * args.ctx_per_slot
    unified = layout != "per-seq"
    numbers = (args.batch, args.prompt_tokens, args.steps, args.threads, ctx, unified, parked)
    return float(in_fresh_process("throughput", "raw_ceiling", *numbers))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=16)
    parser.add_argument("--steps", type=int, default=96)
    parser.add_argument("--parked", default="", help="unified+N layouts: N cells held below")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--ctx-per-slot", type=int, default=1024)
    args = parser.parse_args()

    layouts = [("per-seq", 0), ("unified", 0), ("tinyserve", 0)]
    layouts += [(f"unified+{n}", n) for n in map(int, filter(None, args.parked.split(",")))]
    rates: dict[str, list[float]] = {name: [] for name, _ in layouts}
    rows = []
    for r in range(args.rounds):
        order = layouts[r % len(layouts) :] + layouts[: r % len(layouts)]
        for name, parked in order:
            rate = run_in_subprocess(args, name.split("+")[0], parked)
            rates[name].append(rate)
            rows.append({"round": r + 1, "layout": name, "tok_s": round(rate, 2)})
            print(f"round {r + 1}  {name:>14}  {rate:7.1f} tok/s", flush=True)

    base = statistics.median(rates["per-seq"])
    print(f"\nB={args.batch}, {args.prompt_tokens}-token prompts, {args.steps} steps, "
          f"{args.threads} threads; median over {args.rounds} rounds")  # fmt: skip
    print(f"{'layout':>14} {'tok/s':>8} {'ms/step':>8} {'vs per-seq':>11}")
    for name, _ in layouts:
        med = statistics.median(rates[name])
        print(f"{name:>14} {med:8.1f} {1000 * args.batch / med:8.1f} {med / base:11.2f}")
    print("CSV:", write_csv("kv_span", rows))


if __name__ == "__main__":
    main()
