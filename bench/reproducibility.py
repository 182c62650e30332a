"""Same request, same text? Greedy output of one prompt, alone and in company.

One chat prompt of about ``--prompt-tokens`` tokens (temperature 0, ``--max-tokens``) is sent
``--repeats`` times one after another (the first with a cold prefix cache, the rest warm), then
``--repeats`` times again interleaved with as many other prompts at concurrency ``--clients``.
Per mode (prefix cache on, ``--no-prefix-cache``): how many different texts each way, and how
many tokens the repeats share with the first answer (the shortest common start). Writes
``bench/results/reproducibility.csv``; docs/api.md, Reproducibility, explains the figures.

    .venv/bin/python bench/reproducibility.py [--repeats 4] [--clients 4]
"""

from __future__ import annotations

import argparse
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from common import get_json, post_json, progress, prompt_of, report, start_node

MODES = {"prefix cache on": (), "--no-prefix-cache": ("--no-prefix-cache",)}


def ask(url: str, model: str, prompt: str, max_tokens: int) -> str:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt + "\nSummarize the text above."}],
        "max_tokens": max_tokens,
        "temperature": 0,
    }
    status, reply = post_json(f"{url}/v1/chat/completions", body)
    assert status == 200, reply
    return str(reply["choices"][0]["message"]["content"])


def shared_start(a: str, b: str) -> int:
    """How many characters ``a`` and ``b`` begin with in common."""
    pairs = enumerate(zip(a, b, strict=False))
    return next((i for i, (x, y) in pairs if x != y), min(len(a), len(b)))


def measure(flags: tuple[str, ...], args: argparse.Namespace) -> dict[str, Any]:
    node = start_node(*flags)
    try:
        model = get_json(f"{node.url}/v1/models")["data"][0]["id"]
        prompt = prompt_of(args.prompt_tokens, 1)

        def one(i: int) -> str:  # even: the prompt under test; odd: another one beside it
            text = prompt if i % 2 == 0 else prompt_of(args.prompt_tokens, 100 + i)
            return ask(node.url, model, text, args.max_tokens)

        alone = [ask(node.url, model, prompt, args.max_tokens) for _ in range(args.repeats)]
        with ThreadPoolExecutor(args.clients) as pool:
            mixed = list(pool.map(one, range(2 * args.repeats)))[0::2]
    finally:
        node.stop()
    shared = min(shared_start(alone[0], text) for text in alone + mixed)
    return {
        "alone_distinct": len(set(alone)),
        "concurrent_distinct": len(set(mixed)),
        "concurrent_differ_from_alone": sum(text != alone[0] for text in mixed),
        "shared_start_chars": shared,
        "answer_chars": len(alone[0]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--prompt-tokens", type=int, default=500)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    rows = []
    for mode, flags in MODES.items():
        progress(f"{mode}: {args.repeats} alone, {args.repeats} among others")
        rows.append({"mode": mode, **measure(flags, args)})
    report("reproducibility", rows)


if __name__ == "__main__":
    main()
