"""What a quantized KV cache (``--kv-type q8_0``, ``q4_0``) costs against f16: in the answers,
in speed, and what it buys in memory.

For each type a node is started with the same flags. The answers: the logprobs every prompt
token gets (``echo``, ``max_tokens: 0``) over a fixed set of texts, compared token by token with
f16's (mean and largest absolute difference, in nats), and how many of f16's greedy tokens each
type's greedy reply repeats before it first differs. The speed: a prompt of ``--prompt-tokens``
prefilled, then ``--decode`` tokens decoded, both read from the request's timeline. The memory:
the KV bytes the engine reports for its cells.

    .venv/bin/python bench/kv_type.py
    .venv/bin/python bench/kv_type.py --types f16,q8_0 --prompt-tokens 3000
"""

from __future__ import annotations

import argparse
import re
import statistics

from common import post_json, prompt_of, start_node

from tinyserve.model import resolve_model_path

# Texts of a few kinds (prose, code, a list, a dialogue): the logprobs compared are their
# tokens' given the tokens before, each text behind a long shared preamble so that the
# positions scored sit deep in the cache.
TEXTS = [
    "The lighthouse keeper climbed the spiral stairs at dusk, trimmed the wick, and watched the "
    "beam sweep across the harbour where the fishing boats were coming home.",
    "def mean(values):\n    if not values:\n        raise ValueError('no values')\n    return "
    "sum(values) / len(values)\n",
    "Shopping list: flour, two dozen eggs, butter, sugar, vanilla, baking powder, milk, and a "
    "lemon for the glaze.",
    "Visitor: When does the museum open?\nGuide: At nine on weekdays and ten on Saturdays.\n"
    "Visitor: Is it open on Sundays?\nGuide:",
]


def prompt_logprobs(url: str, text: str) -> list[float]:
    status, reply = post_json(f"{url}/v1/completions", {
        "model": "m", "prompt": text, "max_tokens": 0, "echo": True, "logprobs": 1})  # fmt: skip
    assert status == 200, reply
    return [lp for lp in reply["choices"][0]["logprobs"]["token_logprobs"] if lp is not None]


def greedy_tokens(url: str, text: str, tokens: int) -> list[str]:
    status, reply = post_json(f"{url}/v1/completions", {
        "model": "m", "prompt": text, "max_tokens": tokens, "temperature": 0.0, "ignore_eos": True,
        "logprobs": 1})  # fmt: skip
    assert status == 200, reply
    return list(reply["choices"][0]["logprobs"]["tokens"])


def speed(url: str, args: argparse.Namespace, salt: int) -> tuple[float, float]:
    """Prefill and decode tokens a second of one request, from its timeline."""
    body = {"prompt": prompt_of(args.prompt_tokens, salt), "max_tokens": args.decode,
            "temperature": 0.0, "ignore_eos": True, "timeline": True}  # fmt: skip
    status, reply = post_json(f"{url}/generate", body)
    assert status == 200, reply
    timeline = reply["timeline"]
    prefill_ms = sum(c["ms"] for c in timeline["prefill"])
    prefilled = sum(c["tokens"] for c in timeline["prefill"])
    decode = timeline["decode"]
    return 1e3 * prefilled / prefill_ms, 1e3 * decode["ticks"] / decode["ms"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--types", default="f16,q8_0,q4_0")
    parser.add_argument("--preamble-tokens", type=int, default=1500)
    parser.add_argument("--prompt-tokens", type=int, default=2000)
    parser.add_argument("--decode", type=int, default=64)
    parser.add_argument("--greedy", type=int, default=64, help="greedy tokens compared")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3, help="speed samples per type")
    args = parser.parse_args()
    preamble = prompt_of(args.preamble_tokens, 1) + "\n\n"
    texts = [preamble + t for t in TEXTS]
    model = str(resolve_model_path(None))
    base_lp: list[list[float]] = []
    base_greedy: list[list[str]] = []
    print(f"{'type':6} {'KV MiB':>7} {'mean |dlp|':>10} {'max |dlp|':>9} {'same greedy':>12} "
          f"{'prefill tok/s':>14} {'decode tok/s':>13}")  # fmt: skip
    for kv_type in args.types.split(","):
        node = start_node("--model", model, "--threads", str(args.threads), "--slots", "1",
                          "--ctx-per-slot", "4096", "--kv-type", kv_type,
                          "--speculate", "off")  # fmt: skip
        try:
            mib = re.search(r"KV cache: .*?, (\d+) MiB of", node.log())
            lps = [prompt_logprobs(node.url, t) for t in texts]
            greedy = [greedy_tokens(node.url, t, args.greedy) for t in texts]
            speeds = [speed(node.url, args, salt) for salt in range(10, 10 + args.rounds)]
        finally:
            node.stop(check=False)
        if not base_lp:
            base_lp, base_greedy = lps, greedy
        diffs = [abs(a - b) for x, y in zip(lps, base_lp, strict=True)
                 for a, b in zip(x, y, strict=True)]  # fmt: skip
        same = [next((i for i, (a, b) in enumerate(zip(g, h, strict=False)) if a != b), len(g))
                for g, h in zip(greedy, base_greedy, strict=True)]  # fmt: skip
        prefill = statistics.median(s[0] for s in speeds)
        decode = statistics.median(s[1] for s in speeds)
        print(f"{kv_type:6} {mib.group(1) if mib else '?':>7} {statistics.mean(diffs):10.4f} "
              f"{max(diffs):9.4f} {sum(same):>6}/{sum(len(g) for g in greedy):<5} "
              f"{prefill:14.0f} {decode:13.1f}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
