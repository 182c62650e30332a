"""The pieces of sampling with a grammar, per token, in-process (no server, no decode in the
loop): one prompt is decoded once, then its logits row is sampled again and again. Pieces:
the plain chain (``llama_sampler_sample``, what an unconstrained token costs); the grammar's
verdict on the chain's pick alone (what a constrained token adds when the grammar accepts
the pick); the grammar's pass over the whole vocabulary (what it adds, with a second pick,
when the grammar refuses: the timeline's ``grammar.full_passes`` counts those). Also the
build time of a sampler with a grammar (the frontend's check and the slot grant pay it).

    .venv/bin/python bench/grammar_cost.py
"""

from __future__ import annotations

import argparse
import statistics
import time

import llama_cpp

from tinyserve.config import build_config
from tinyserve.engine.runtime.runtime import LlamaRuntime, RuntimeSpec
from tinyserve.frontend.structured.json_schema import schema_to_grammar
from tinyserve.protocol import SamplingParams

PROMPT = b"Here are some numbers as a JSON array: ["
SCHEMA = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 999}}


def per_token_ms(runtime: LlamaRuntime, params: SamplingParams, row: int, n: int,
                 piece: str) -> float:  # fmt: skip
    sampler = runtime.new_sampler(params)
    logits = sampler._logits(runtime.ctx, row)
    try:
        started = time.perf_counter()
        for _ in range(n):
            if piece == "verdict":
                sampler._allows(int(logits.argmax()))
            elif piece == "full pass":
                sampler._permitted(logits)
            else:
                sampler.sample(runtime.ctx, row)
        return (time.perf_counter() - started) * 1e3 / n
    finally:
        sampler.free()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    config = build_config({"ctx_per_slot": 512, "slots": 1}, environ={})
    runtime = LlamaRuntime(RuntimeSpec.from_config(config))
    vocab = llama_cpp.Llama(str(runtime.spec.model_path), vocab_only=True, verbose=False)
    ids = list(vocab.tokenize(PROMPT, add_bos=False))
    runtime.batch.clear()
    row = runtime.batch.add_span(ids, 0, len(ids), 0, 0, True)
    assert runtime.decode() == 0
    grammar = schema_to_grammar(SCHEMA)
    plain = SamplingParams(temperature=0.8, top_k=40, seed=1)
    constrained = SamplingParams(temperature=0.8, top_k=40, seed=1, grammar=grammar)
    kinds = {
        "chain pick": (plain, "pick"),
        "grammar verdict": (constrained, "verdict"),
        "grammar full pass": (constrained, "full pass"),
    }
    figures: dict[str, list[float]] = {k: [] for k in kinds}
    for _ in range(args.repeats):
        for kind, (params, piece) in kinds.items():
            figures[kind].append(per_token_ms(runtime, params, row, args.tokens, piece))
    for kind, values in figures.items():
        print(f"{kind:>18}: median {statistics.median(values):7.3f} ms/token "
              f"(min {min(values):.3f}, max {max(values):.3f})")  # fmt: skip
    builds = []
    for _ in range(20):
        started = time.perf_counter()
        runtime.new_sampler(constrained).free()
        builds.append((time.perf_counter() - started) * 1e3)
    print(f"sampler + grammar build: median {statistics.median(builds):.3f} ms")
    runtime.close()


if __name__ == "__main__":
    main()
