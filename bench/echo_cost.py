"""What prompt log-probabilities cost: ``echo`` with ``logprobs`` against a plain prefill.

An evaluation harness scores a multiple-choice answer by asking ``/v1/completions`` for
``echo: true, logprobs: k`` over the whole prompt. The engine then asks llama.cpp for logits
on every prompt row (one output row of vocabulary size each, instead of one per prompt) and
turns each into a log-softmax and top-k in numpy. Here, on one node, for prompts of several
lengths, sequential requests (each prompt distinct, so the prefix cache serves none) in
three modes, interleaved so that drifts of the machine hit all alike:

    plain   max_tokens 1, no echo: one prefill and the first token
    echo0   echo, logprobs 0, max_tokens 0: the prompt's own logprobs only
    echo5   echo, logprobs 5, max_tokens 1: five alternatives per prompt token

Prints, per request, the median of the engine process's CPU time (user + system, from
/proc: what the request cost, little moved by other load on a shared machine) and of the
wall time (client side), each with its ratio to plain, and writes
bench/results/echo_cost.csv. llama.cpp runs one thread, so CPU time is compute, not spinning.

    .venv/bin/python bench/echo_cost.py [--lengths 128 512] [--reps 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path
from typing import Any

from common import get_json, post_json, progress, prompt_of, start_node, write_csv

MODES: dict[str, dict[str, Any]] = {
    "plain": {"max_tokens": 1},
    "echo0": {"echo": True, "logprobs": 0, "max_tokens": 0},
    "echo5": {"echo": True, "logprobs": 5, "max_tokens": 1},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[128, 512])
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    node = start_node("--ctx-per-slot", "1024", "--slots", "2", "--threads", "1")
    try:
        rows = measure(node.url, node.engine_pid(), args.lengths, args.reps)
    finally:
        node.stop(check=False)
    write_csv("echo_cost", rows)
    for row in rows:
        print(
            f"{row['prompt_tokens']:5d} tokens  {row['mode']:6s}  "
            f"engine CPU {row['cpu_ms']:8.1f} ms (x{row['cpu_ratio']:.2f})  "
            f"wall {row['wall_ms']:8.1f} ms (x{row['wall_ratio']:.2f})"
        )


def cpu_ms(pid: int) -> float:
    """User + system CPU time of process ``pid`` so far, in ms."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1e3 / os.sysconf("SC_CLK_TCK")


def measure(url: str, engine: int, lengths: list[int], reps: int) -> list[dict[str, Any]]:
    [model] = get_json(f"{url}/v1/models")["data"]
    walls: dict[tuple[int, str], list[float]] = {}
    cpus: dict[tuple[int, str], list[float]] = {}
    salt = 0
    for length in lengths:
        for rep in range(reps + 1):  # the first round warms up, and is not counted
            for mode, extra in MODES.items():
                salt += 1
                body = {"model": model["id"], "prompt": prompt_of(length, salt),
                        "temperature": 0, **extra}  # fmt: skip
                started, cpu = time.perf_counter(), cpu_ms(engine)
                status, reply = post_json(f"{url}/v1/completions", body)
                elapsed, used = (time.perf_counter() - started) * 1e3, cpu_ms(engine) - cpu
                assert status == 200, reply
                if rep:
                    walls.setdefault((length, mode), []).append(elapsed)
                    cpus.setdefault((length, mode), []).append(used)
            progress(f"{length} tokens: round {rep}/{reps}")
    rows = []
    for length in lengths:
        cpu0 = statistics.median(cpus[(length, "plain")])
        wall0 = statistics.median(walls[(length, "plain")])
        for mode in MODES:
            cpu = statistics.median(cpus[(length, mode)])
            wall = statistics.median(walls[(length, mode)])
            row = {"prompt_tokens": length, "mode": mode, "runs": reps}
            row |= {"cpu_ms": round(cpu, 1), "cpu_ratio": round(cpu / cpu0, 3)}
            row |= {"wall_ms": round(wall, 1), "wall_ratio": round(wall / wall0, 3)}
            rows.append(row)
    return rows


if __name__ == "__main__":
    main()
