"""The most speculation can give on this machine: a decode step's time by its guessed rows.

Speculation pays when a step of ``B * (1 + k)`` rows (each of ``B`` sequences' last token and
``k`` guesses after it) costs less than the ``1 + k`` steps of ``B`` rows it replaces. Bare
llama.cpp, as TinyServe's engine sets it up (a pool of ``--ctx-per-slot`` cells per sequence,
``n_ubatch`` = ``n_batch`` = 512): ``B`` sequences prefilled to ``--context`` tokens, then
``--steps`` timed steps at each ``k``, each step writing every sequence's ``1 + k`` rows at
the same positions (the cells after its context dropped again), so the context stays what it
is. Every sequence guesses the same ``k``, which keeps the step one ubatch (llama.cpp's
``split_equal`` takes as many tokens of each sequence into one).

``--guessers G``: only the first ``G`` sequences guess, the others write their last token
alone; the step is then two ubatches (``split_equal`` takes one token of each sequence into
the first, the guesses into a second), the price ``StepCost.apart`` puts on a guess among
several sequences.

For each ``(B, context, k)``: the median step in ms; the ceiling ``(1 + k) * T(B, 0) / T(B, k)``,
the speed-up were every guess right; and the speed-up at an acceptance rate ``a`` per guessed
token (``--accept``), with ``(1 - a^(k+1)) / (1 - a)`` tokens expected per sequence and step.
One fresh process per ``(B, context)``.

    .venv/bin/python bench/spec_ceiling.py --batch 1,8 --context 64,800 --max-k 8
    .venv/bin/python bench/spec_ceiling.py --batch 8 --context 64 --max-k 4 --guessers 1
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

from common import in_fresh_process, write_csv
from throughput import _fill, bare_llama, fill_context


def step_times(
    batch: int, context: int, max_k: int, steps: int, threads: int, cells: int, guessers: int
) -> list[float]:
    """Median seconds of a step of ``batch`` rows and ``k`` more for each of the first
    ``guessers`` sequences, for k = 0 .. ``max_k``."""
    import llama_cpp

    medians = []
    with bare_llama(batch * cells, 512, batch, False, threads) as (lctx, lbatch):
        memory = llama_cpp.llama_get_memory(lctx)
        for seq in range(batch):
            fill_context(lctx, lbatch, seq, context)
        for k in range(max_k + 1):
            rows = [
                (1000 + j, context + j, seq, True)
                for seq in range(batch)
                for j in range(k + 1 if seq < guessers else 1)
            ]
            timed = []
            for step in range(steps + 2):  # the first two warm the shapes up, untimed
                _fill(lbatch, rows)
                started = time.perf_counter()
                assert llama_cpp.llama_decode(lctx, lbatch) == 0
                if step >= 2:
                    timed.append(time.perf_counter() - started)
                for seq in range(batch):
                    llama_cpp.llama_memory_seq_rm(memory, seq, context, -1)
            medians.append(statistics.median(timed))
    return medians


def expected_tokens(k: int, accept: float) -> float:
    """Tokens a sequence takes from a step with ``k`` guesses, each right with ``accept``."""
    return float(k + 1) if accept >= 1.0 else (1 - accept ** (k + 1)) / (1 - accept)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", default="1,8", help="sequences per step, comma-separated")
    parser.add_argument("--context", default="64,800", help="tokens each sequence holds")
    parser.add_argument("--max-k", type=int, default=8)
    parser.add_argument("--steps", type=int, default=15, help="timed steps per k")
    parser.add_argument("--accept", default="0.6,0.8", help="acceptance rates to price")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--ctx-per-slot", type=int, default=4096)
    parser.add_argument("--guessers", type=int, help="how many sequences guess (default all)")
    args = parser.parse_args()
    accepts = [float(a) for a in args.accept.split(",")]
    table: list[dict[str, Any]] = []
    for batch in (int(b) for b in args.batch.split(",")):
        for context in (int(c) for c in args.context.split(",")):
            guessers = batch if args.guessers is None else min(args.guessers, batch)
            numbers = (
                batch,
                context,
                args.max_k,
                args.steps,
                args.threads,
                args.ctx_per_slot,
                guessers,
            )
            times = in_fresh_process("spec_ceiling", "step_times", *numbers)
            for k, seconds in enumerate(times):
                row: dict[str, Any] = {
                    "batch": batch,
                    "guessers": guessers,
                    "context": context,
                    "k": k,
                    "step_ms": round(seconds * 1000, 2),
                    # tokens the step gives against the plain steps they would take
                    "ceiling": round((batch + guessers * k) / batch * times[0] / seconds, 2),
                }
                for a in accepts:
                    tokens = batch - guessers + guessers * expected_tokens(k, a)
                    row[f"at_{a}"] = round(tokens / batch * times[0] / seconds, 2)
                table.append(row)
                print(" | ".join(str(v) for v in row.values()), flush=True)
    name = "spec_ceiling" if args.guessers is None else f"spec_ceiling_guessers_{args.guessers}"
    path = write_csv(name, table)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
