"""The prefix cache on vs off, in the same run, on two workloads.

(a) 32 requests sharing a ~256-token system prompt, each with its own question, from 4
    concurrent clients, after one warm-up request (run in both modes) that puts the system
    prompt in the cache, as any running deployment would have;
(b) 8 three-turn chat conversations running at once; each turn's prompt is the whole
    conversation so far (chat template text, the model's replies included).

For each: prompt tokens served from the cache (and the share of the shared system prompt that
was skipped), TTFT p50/p95 and generated tok/s. Writes bench/results/prefix_reuse.csv/.png.

    .venv/bin/python bench/prefix_reuse.py
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import aiohttp
from common import RESULTS, Result, percentile, start_node, stream_request, write_csv

RULES = [
    "Answer in one short paragraph.",
    "Never invent account numbers, order numbers or prices.",
    "If a question is about billing, point to the billing page.",
    "If a question is about passwords, explain the reset link on the sign-in page.",
    "Be polite, and do not repeat the question back to the customer.",
    "When you do not know, say so and offer to open a support ticket.",
]
SYSTEM = (
    "<|im_start|>system\nYou are the support assistant of ACME Online, a shop that sells "
    "garden tools, kitchen tools and spare parts. Follow these rules. "
    + " ".join(f"Rule {i + 1}: {rule}" for i, rule in enumerate(RULES * 2))
    + "<|im_end|>\n"
)
TOPICS = [
    "passwords",
    "billing",
    "shipping",
    "returns",
    "spare parts",
    "gift cards",
    "warranty",
    "accounts",
]


def user_turn(text: str) -> str:
    return f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"


def question(i: int) -> str:
    return f"Question {i}: I have a problem with {TOPICS[i % len(TOPICS)]}."


def shared_prefix_tokens(n: int) -> tuple[int, int]:
    """(system prompt tokens, tokens every one of the ``n`` prompts of (a) starts with)."""
    import llama_cpp

    from tinyserve.model import resolve_model_path

    vocab = llama_cpp.Llama(str(resolve_model_path(None)), vocab_only=True, verbose=False)

    def tokenize(text: str) -> list[int]:
        return vocab.tokenize(text.encode(), add_bos=True, special=True)

    prompts = [tokenize(SYSTEM + user_turn(question(i))) for i in range(n)]
    common = 0
    while all(len(p) > common and p[common] == prompts[0][common] for p in prompts):
        common += 1
    return len(tokenize(SYSTEM)), common


async def shared_system_prompt(
    url: str, n: int, clients: int, max_tokens: int
) -> tuple[float, list[Result]]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        warm = {"prompt": SYSTEM + user_turn("Hello!"), "max_tokens": max_tokens}
        await stream_request(session, url, warm)
        queue = list(range(n))
        results: list[Result] = []

        async def client() -> None:
            while queue:
                i = queue.pop(0)
                body = {"prompt": SYSTEM + user_turn(question(i)), "max_tokens": max_tokens}
                results.append(await stream_request(session, url, body))

        started = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(clients)))
        return time.perf_counter() - started, results


async def conversations(
    url: str, n: int, turns: int, max_tokens: int
) -> tuple[float, list[Result]]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        results: list[Result] = []

        async def conversation(i: int) -> None:
            history = SYSTEM
            for turn in range(turns):
                history += user_turn(
                    f"Conversation {i}, turn {turn}: tell me about "
                    f"{TOPICS[(i + turn) % len(TOPICS)]}."
                )
                body: dict[str, Any] = {"prompt": history, "max_tokens": max_tokens}
                text: list[str] = []
                result = await stream_request(session, url, body, text_sink=text)
                while result.status == 503:  # queue_full, were --max-queue below the chats
                    await asyncio.sleep(1)
                    text.clear()
                    result = await stream_request(session, url, body, text_sink=text)
                results.append(result)
                history += "".join(text) + "<|im_end|>\n"

        started = time.perf_counter()
        await asyncio.gather(*(conversation(i) for i in range(n)))
        return time.perf_counter() - started, results


def row(
    scenario: str, cache: str, seconds: float, results: list[Result], shared: int | None
) -> dict[str, Any]:
    assert all(r.status == 200 for r in results), [r.reason for r in results]
    ttft = [r.ttft for r in results if r.ttft is not None]
    prompt = sum(r.prompt_tokens for r in results)
    cached = sum(r.cached_tokens for r in results)
    return {
        "scenario": scenario,
        "cache": cache,
        "requests": len(results),
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "cached_share_of_prompt": round(cached / prompt, 3),
        "shared_prefix_skipped": round(cached / (shared * len(results)), 3) if shared else "",
        "ttft_p50_s": round(percentile(ttft, 0.5), 3),
        "ttft_p95_s": round(percentile(ttft, 0.95), 3),
        "tok_s": round(sum(r.tokens for r in results) / seconds, 1),
    }


def plot(rows: list[dict[str, Any]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scenarios = sorted({r["scenario"] for r in rows})
    fig, ax = plt.subplots(figsize=(7, 4))
    for offset, cache in ((-0.2, "off"), (0.2, "on")):
        values = [
            next(r["ttft_p50_s"] for r in rows if r["scenario"] == s and r["cache"] == cache)
            for s in scenarios
        ]
        ax.bar([i + offset for i in range(len(scenarios))], values, 0.4, label=f"cache {cache}")
    ax.set(xticks=range(len(scenarios)), xticklabels=scenarios, ylabel="TTFT p50 (s)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(RESULTS / "prefix_reuse.png", dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--conversations", type=int, default=8)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=32)
    args = parser.parse_args()
    system, common = shared_prefix_tokens(args.requests)
    shared = common // 16 * 16  # what a block-aligned cache can skip of every prompt
    print(
        f"system prompt: {system} tokens; all prompts of (a) share their first {common} "
        f"tokens ({shared} in full blocks)"
    )
    rows = []
    for cache in ("off", "on"):
        node = start_node("--prefix-cache" if cache == "on" else "--no-prefix-cache", frontends=1)
        try:
            seconds, results = asyncio.run(
                shared_system_prompt(node.url, args.requests, args.clients, args.max_tokens)
            )
            rows.append(row("a: shared system prompt", cache, seconds, results, shared))
            print(rows[-1], flush=True)
            seconds, results = asyncio.run(
                conversations(node.url, args.conversations, args.turns, args.max_tokens)
            )
            rows.append(row("b: 3-turn conversations", cache, seconds, results, None))
            print(rows[-1], flush=True)
        finally:
            node.stop(check=False)
    for scenario in sorted({r["scenario"] for r in rows}):
        off, on = (
            next(r for r in rows if r["scenario"] == scenario and r["cache"] == c)
            for c in ("off", "on")
        )
        print(
            f"{scenario}: TTFT p50 {off['ttft_p50_s']}s off -> {on['ttft_p50_s']}s on "
            f"({off['ttft_p50_s'] / on['ttft_p50_s']:.1f}x lower); tok/s {off['tok_s']} -> "
            f"{on['tok_s']}"
        )
    print(f"wrote {write_csv('prefix_reuse', rows)}")
    plot(rows)
    print(f"wrote {RESULTS / 'prefix_reuse.png'}")


if __name__ == "__main__":
    main()
