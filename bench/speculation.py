"""What prompt-lookup speculation gives: the same node with ``--speculate ngram`` and with
``--speculate off``, and llama-server (same vendored llama.cpp) with its own n-gram speculation
(``--spec-type ngram-simple``), in one run, rounds alternating the servers' order.

Workloads, each a closed loop of ``--concurrency`` clients sending greedy chat requests of
``--max-tokens`` tokens:

- ``extract``: a passage, then "repeat it word for word" (text that copies its input);
- ``code``: a function, then "write it out again with a docstring" (code rewritten);
- ``json``: a JSON record, then "return it unchanged" (fields echoed);
- ``story``: a story to continue (text that does not repeat its input).

``--baseline COMMIT`` adds a node running that commit's code with its default speculation
(``common.code_at``). ``--temperature T`` makes them sampled requests (each with a seed of
its own), where a guess holds with the chance the sampler gives it. ``--draft-model PATH``
adds the node guessing with that model (``--speculate draft``), and gives llama-server the
same draft (``-md``) instead of its n-gram speculation.

Figures per server and load: output tokens per second (all clients), TTFT p50, and the ratio
against the node without speculation; from the speculating node's ``/metrics``, the share of
guessed tokens accepted. Writes ``bench/results/speculation.csv`` (``--name``).

    .venv/bin/python bench/speculation.py
    .venv/bin/python bench/speculation.py --workloads extract,story --concurrency 1 --rounds 2
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import code_at, write_csv
from vs_llama_server import (
    Run,
    Sample,
    Server,
    measure,
    start_llama_server,
    start_tinyserve,
    stream_openai,
)

PASSAGE = (
    "The lighthouse stood on a rock at the edge of the bay. Every evening the keeper climbed "
    "its ninety steps, lit the lamp, and wrote the weather in a small book: wind from the "
    "west, rain after midnight, a fishing boat passing at nine. In the morning he put the "
    "lamp out and walked down to the village for bread."
)
CODE = (
    "def moving_average(values, window):\n"
    "    totals = []\n"
    "    running = 0\n"
    "    for i, value in enumerate(values):\n"
    "        running += value\n"
    "        if i >= window:\n"
    "            running -= values[i - window]\n"
    "        totals.append(running / min(i + 1, window))\n"
    "    return totals\n"
)
RECORD = (
    '{"id": 4821, "name": "Ada Lovelace", "email": "ada@example.org", "city": "London", '
    '"languages": ["English", "French"], "active": true, "joined": "2021-03-14", '
    '"notes": "prefers email; call after noon"}'
)
PROMPTS = {
    "extract": f"{PASSAGE}\n\nRepeat the passage above word for word.",
    "code": f"{CODE}\nWrite this function out again, the same code, with a docstring added.",
    "json": f"{RECORD}\n\nReturn this JSON record unchanged.",
    "story": "Write a long story about a fox who learns to sail. Once upon a time,",
}


def closed(
    workload: str, concurrency: int, per_client: int, max_tokens: int, temperature: float = 0.0
) -> Run:
    prompt = PROMPTS[workload]

    async def run(session: aiohttp.ClientSession, server: Server) -> list[Sample]:
        async def client(index: int) -> list[Sample]:
            samples = []
            for i in range(per_client):
                body: dict[str, Any] = {
                    "messages": [{"role": "user", "content": prompt}],
                    "max_tokens": max_tokens,
                }
                if temperature > 0:
                    body.update(temperature=temperature, seed=index * per_client + i)
                samples.append(await stream_openai(session, server, "/v1/chat/completions", body))
            return samples

        done = await asyncio.gather(*(client(i) for i in range(concurrency)))
        return [s for samples in done for s in samples]

    return run


def counters(url: str) -> dict[str, float]:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    found = {}
    for line in text.splitlines():
        if line.startswith("tinyserve_speculative_"):
            name, value = line.rsplit(" ", 1)
            found[name] = float(value)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", default="extract,code,json,story")
    parser.add_argument("--concurrency", default="1,8")
    parser.add_argument("--per-client", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--ctx-per-slot", type=int, default=2048)
    parser.add_argument("--frontends", type=int, default=1)
    parser.add_argument("--no-llama-server", action="store_true")
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--draft-model", type=Path, default=None)
    parser.add_argument("--name", default="speculation", help="the CSV's name in bench/results/")
    parser.add_argument("--baseline", help="a commit whose code also runs, speculating")
    args = parser.parse_args()
    with code_at(args.baseline) as baseline:
        compare(args, baseline)


def compare(args: argparse.Namespace, baseline: Path | None) -> None:
    """Start the servers, run every workload at every concurrency, and print the ratios."""
    args.slo_ttft_ms, args.slo_tpot_ms = 2000.0, 100.0  # what ``figures`` reads

    from tinyserve.model import resolve_model_path

    model_path = resolve_model_path(str(args.model) if args.model else None)
    args.tinyserve_flag = ["--speculate", "off"]
    off = start_tinyserve(args, model_path, name="tinyserve-off")
    args.tinyserve_flag = ["--speculate", "ngram"]
    on = start_tinyserve(args, model_path, name="tinyserve-ngram")
    servers = [off, on]
    if baseline is not None:
        servers.append(start_tinyserve(args, model_path, "tinyserve-ngram-before", baseline))
    if args.draft_model:
        args.tinyserve_flag = ["--draft-model", str(args.draft_model)]
        servers.append(start_tinyserve(args, model_path, name="tinyserve-draft"))
    if not args.no_llama_server:
        if args.draft_model:
            args.llama_server_flag = ["-md", str(args.draft_model), "--spec-draft-n-max", "8"]
        else:
            args.llama_server_flag = ["--spec-type", "ngram-simple", "--spec-draft-n-max", "8"]
        llama = start_llama_server(args, model_path)
        llama.name = "llama-server-draft" if args.draft_model else "llama-server-ngram"
        servers.append(llama)
    rows: list[dict[str, Any]] = []
    try:
        for server in servers:  # a first request off the record: each server warmed alike
            asyncio.run(measure(server, closed("story", 1, 1, 32), args))
        for workload in args.workloads.split(","):
            for concurrency in (int(c) for c in args.concurrency.split(",")):
                run = closed(
                    workload, concurrency, args.per_client, args.max_tokens, args.temperature
                )
                got: dict[str, list[float]] = {s.name: [] for s in servers}
                guessing = [x for x in servers if x.name.startswith("tinyserve-") and x is not off]
                before = {x.name: counters(x.url) for x in guessing}
                for r in range(args.rounds):
                    order = servers if r % 2 == 0 else servers[::-1]
                    for server in order:
                        figures = asyncio.run(measure(server, run, args))
                        got[server.name].append(figures["out_tok_s"])
                        rows.append(
                            {"workload": workload, "concurrency": concurrency, "round": r + 1,
                             "server": server.name, **figures}
                        )  # fmt: skip
                shares = []
                for x in guessing:
                    after = counters(x.url)
                    guessed, accepted = (
                        after.get(f"tinyserve_speculative_{what}_tokens_total", 0)
                        - before[x.name].get(f"tinyserve_speculative_{what}_tokens_total", 0)
                        for what in ("guessed", "accepted")
                    )
                    share = accepted / guessed if guessed else 0.0
                    shares.append(f"{x.name}: {share:.2f} of {guessed:.0f} guessed taken")
                base = statistics.median(got[off.name])
                line = [f"{workload:8s} c={concurrency:<3d}"]
                for server in servers:
                    tok_s = statistics.median(got[server.name])
                    line.append(f"{server.name} {tok_s:7.1f} tok/s ({tok_s / base:4.2f}x)")
                print("  ".join(line + shares))
    finally:
        for server in servers:
            server.stop()
    print(f"wrote {write_csv(args.name, rows)}")


if __name__ == "__main__":
    main()
