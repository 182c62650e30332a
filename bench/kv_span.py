"""What a decode step costs by the KV layout alone: llama.cpp with no server around it.

llama.cpp attends each row of a step over the cells up to the highest one in use (rounded up
to 256). In one unified pool (TinyServe) that span covers every running sequence and any
parked prefix below them; with a pool per sequence (llama-server's default, ``-np N`` without
``-kvu``) each row attends over its own sequence's cells only. Same bare loop as
``throughput.py``'s ceiling (B prompts, then greedy decode steps), one fresh process per run,
the layouts in rotating order over the rounds:

- ``per-seq``: ``kv_unified = false``, ``ctx / B`` cells per sequence;
- ``unified``: one pool, the running sequences packed from cell 0;
- ``unified+N``: one pool with N cells held below them by a sequence that never decodes.

    .venv/bin/python bench/kv_span.py --batch 8 --parked 1024,3072 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import statistics

from common import in_fresh_process, write_csv


def run_in_subprocess(args: argparse.Namespace, unified: bool, parked: int) -> float:
    numbers = (args.batch, args.prompt_tokens, args.steps, args.threads, args.ctx, unified, parked)
    return float(in_fresh_process("throughput", "raw_ceiling", *numbers))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=16)
    parser.add_argument("--steps", type=int, default=96)
    parser.add_argument("--parked", default="1024,3072", help="cells held below, comma-separated")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--ctx", type=int, default=4096)
    args = parser.parse_args()

    layouts = [("per-seq", False, 0), ("unified", True, 0)]
    layouts += [(f"unified+{n}", True, n) for n in map(int, args.parked.split(",")) if n]
    rates: dict[str, list[float]] = {name: [] for name, _, _ in layouts}
    rows = []
    for r in range(args.rounds):
        order = layouts[r % len(layouts) :] + layouts[: r % len(layouts)]
        for name, unified, parked in order:
            rate = run_in_subprocess(args, unified, parked)
            rates[name].append(rate)
            rows.append({"round": r + 1, "layout": name, "tok_s": round(rate, 2)})
            print(f"round {r + 1}  {name:>14}  {rate:7.1f} tok/s", flush=True)

    base = statistics.median(rates["per-seq"])
    print(f"\nB={args.batch}, {args.prompt_tokens}-token prompts, {args.steps} steps, "
          f"{args.threads} threads; median over {args.rounds} rounds")  # fmt: skip
    print(f"{'layout':>14} {'tok/s':>8} {'ms/step':>8} {'vs per-seq':>11}")
    for name, _, _ in layouts:
        med = statistics.median(rates[name])
        print(f"{name:>14} {med:8.1f} {1000 * args.batch / med:8.1f} {med / base:11.2f}")
    print("CSV:", write_csv("kv_span", rows))


if __name__ == "__main__":
    main()
