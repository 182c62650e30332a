"""How much llama.cpp's first-token logprobs move with how a prompt is split, vs. a wrong
prefix-cache reuse: the measurement behind the prefix-cache tests' tolerance.

In-process (no server): the same 111-token chat prompt prefilled at once, in chunks of
7/16/32/48/100 tokens, with 96 tokens reused from the prefix cache, and with the cache handing
over the blocks of the same tokens shifted by one position. Prints the largest difference of
the top-5 tokens' logprobs from the one-piece prefill, and whether the top 5 stayed the same.

    .venv/bin/python bench/chunking_noise.py
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.engine.conftest import core_config
from tests.engine.test_core import Driver
from tests.engine.test_kv_space import chat, hand_over_instead
from tinyserve.engine.core import EngineCore
from tinyserve.engine.runtime.runtime import LlamaRuntime, RuntimeSpec


def first(d: Driver, prompt: list[int]) -> dict[int, float]:
    rid = d.submit(prompt, max_tokens=2, logprobs=20)
    d.run()
    entry = next(e for u in d.updates[rid] for e in u.logprobs)
    return {token: lp for token, lp in entry[1]}


def compare(base: dict[int, float], other: dict[int, float]) -> str:
    top = list(base)[:5]
    drift = max(abs(base[t] - other.get(t, float("-inf"))) for t in top)
    return f"max |d logprob| over top 5 = {drift:.3f} nats; top 5 same: {top == list(other)[:5]}"


def main() -> None:
    import llama_cpp

    from tinyserve.model import resolve_model_path

    vocab = llama_cpp.Llama(str(resolve_model_path(None)), vocab_only=True, verbose=False)

    def tokenize(text: str) -> list[int]:
        return vocab.tokenize(text.encode(), add_bos=True, special=True)

    runtime = LlamaRuntime(RuntimeSpec.from_config(core_config()))
    question = tokenize(chat("Name three rivers in Europe."))
    earlier = tokenize(chat("What is the capital of France?"))

    def driver(**overrides: Any) -> Driver:
        settings = {"chunk": 256, "max_batch_tokens": 256, **overrides}
        return Driver(EngineCore(core_config(**settings), runtime))

    print(f"prompt: {len(question)} tokens")
    base = first(driver(prefix_cache=False), question)
    for chunk in (7, 16, 32, 48, 100):
        print(
            f"chunks of {chunk:>3}: "
            + compare(base, first(driver(prefix_cache=False, chunk=chunk), question))
        )
    d = driver()
    first(d, earlier)
    print("prefix cache hit:  " + compare(base, first(d, question)))
    d = driver()
    shifted = question[:1] + tokenize("Note:")[1:2] + question[1:]
    first(d, shifted)
    hand_over_instead(d, question)
    print("wrong reuse (shifted by one): " + compare(base, first(d, question)))
    runtime.close()


if __name__ == "__main__":
    main()
