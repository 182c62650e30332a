"""What picking one token costs the engine, per row, right after the decode that made its logits.

Decodes a batch of ``--rows`` one-token rows (as a decode step of that many sequences does),
then times ``Sampler.sample`` on every row, for: plain greedy (numpy's argmax over the logits
buffer), the same greedy through llama.cpp's chain (``llama_sampler_sample``, what plain greedy
used before), and a seeded top-k/top-p/temperature chain. ``--steps`` decodes, each sampled
by one sampler kind in turn, so all kinds see the logits equally fresh. Prints microseconds
per row (median, p90) and what that is per decode step of ``--rows`` rows.

    .venv/bin/python bench/sampling_cost.py [--rows 8] [--steps 300]
"""

from __future__ import annotations

import argparse
import statistics
import time

from common import percentile, write_csv


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    from tinyserve.config import build_config
    from tinyserve.engine.runtime.runtime import LlamaRuntime, RuntimeSpec
    from tinyserve.protocol import SamplingParams

    config = build_config({"threads": args.threads, "slots": args.rows}, environ={})
    runtime = LlamaRuntime(RuntimeSpec.from_config(config))
    kinds = {
        "greedy (argmax)": SamplingParams(temperature=0.0),
        "greedy (llama.cpp chain)": SamplingParams(temperature=0.0),
        "top-k 40, top-p 0.9, temp 0.8": SamplingParams(
            temperature=0.8, top_k=40, top_p=0.9, seed=1
        ),
    }
    samplers = {name: [runtime.new_sampler(params) for _ in range(args.rows)]
                for name, params in kinds.items()}  # fmt: skip
    for sampler in samplers["greedy (llama.cpp chain)"]:
        sampler._argmax = False  # the path plain greedy took before
    times: dict[str, list[float]] = {name: [] for name in kinds}
    tokens = [1000 + 17 * row for row in range(args.rows)]
    for step in range(args.steps):
        runtime.batch.clear()
        for seq, token in enumerate(tokens):
            runtime.batch.add(token, step, seq, True)
        assert runtime.decode() == 0
        name = list(kinds)[step % len(kinds)]
        for row in range(args.rows):
            started = time.perf_counter()
            tokens[row] = samplers[name][row].sample(runtime.ctx, row)
            times[name].append(time.perf_counter() - started)
    rows = []
    for name, values in times.items():
        us = [v * 1e6 for v in values]
        row = {"sampler": name, "rows": args.rows, "us_p50": round(statistics.median(us), 1),
               "us_p90": round(percentile(us, 90), 1),
               "ms_per_step": round(statistics.median(us) * args.rows / 1e3, 3)}  # fmt: skip
        rows.append(row)
        print(" | ".join(str(v) for v in row.values()))
    print(f"wrote {write_csv('sampling_cost', rows)}")
    runtime.close()


if __name__ == "__main__":
    main()
