"""Round robin against session affinity in front of two nodes, in the same run.

Two nodes (``tinyserve serve``, one frontend each) behind one nginx rendered with
``deploy/render_nginx.py --affinity``. K chat conversations run at once, each several turns;
each turn's prompt is the whole conversation so far (the user turns and the model's replies,
chat template text; with ``--system``, after a ~256-token system prompt they all share).
The same workload goes through nginx without the ``X-Session-Id`` header (round robin,
today's balancing) and with it (consistent hash per node), alternating which goes first
in each round; every round and mode has conversations of its own, so neither finds what
the other left in a cache. With
``--system``, each node has seen the system prompt once before the first round (as in any
running deployment), and both modes hit it on either node.

For each mode: the prefix cache's hit rate (cached / prompt tokens, all turns and turns 2+),
the share of turns 2+ served by the node that served the turn before, and TTFT p50/p95.
Writes bench/results/affinity.csv (one row per mode and round), affinity_turns.csv (every
turn) and affinity.png.

    .venv/bin/python bench/affinity.py --conversations 4 --turns 4 --threads 1
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from common import (
    Result,
    percentile,
    progress,
    report,
    save_plot,
    start_node,
    stream_request,
    write_csv,
)
from prefix_reuse import SYSTEM, TOPICS, user_turn

from tests.integration.nginx import Nginx, find_nginx
from tests.integration.node import Node

MODES = ("round_robin", "affinity")
SESSION = "X-Session-Id"


@dataclass
class Turn:
    """One turn of one conversation as the client saw it."""

    mode: str
    round: int
    conversation: int
    turn: int
    node: int  # which node's frontend answered (0, 1)
    result: Result


def served_by(pids: list[int]) -> aiohttp.TraceConfig:
    """Collects each reply's ``X-TinyServe-Frontend`` (the frontend's pid) as its headers
    arrive, so that ``common.stream_request`` serves unchanged."""
    trace = aiohttp.TraceConfig()

    async def on_end(_: Any, __: Any, params: aiohttp.TraceRequestEndParams) -> None:
        pids.append(int(params.response.headers.get("X-TinyServe-Frontend", "0")))

    trace.on_request_end.append(on_end)
    return trace


async def conversation(
    url: str, nodes: list[Node], mode: str, rnd: int, index: int, args: argparse.Namespace
) -> list[Turn]:
    """One conversation, turn after turn; a turn both nodes refuse is sent again."""
    name = f"{mode}-{rnd}-{index}"
    headers = {SESSION: name} if mode == "affinity" else {}
    pids: list[int] = []
    timeout = aiohttp.ClientTimeout(total=600)
    turns: list[Turn] = []
    history = SYSTEM if args.system else ""
    async with aiohttp.ClientSession(
        headers=headers, timeout=timeout, trace_configs=[served_by(pids)]
    ) as http:
        for number in range(args.turns):
            topic = TOPICS[(index + number) % len(TOPICS)]
            history += user_turn(f"Conversation {name}, turn {number}: tell me about {topic}.")
            body = {"prompt": history, "max_tokens": args.max_tokens, "ignore_eos": True}
            text: list[str] = []
            result = await stream_request(http, url, body, text_sink=text)
            while result.status == 503:
                await asyncio.sleep(1)
                text.clear()
                result = await stream_request(http, url, body, text_sink=text)
            assert result.status == 200, result
            node = next(i for i, n in enumerate(nodes) if pids[-1] in n.children)
            turns.append(Turn(mode, rnd, index, number, node, result))
            history += "".join(text) + "<|im_end|>\n"
    return turns


async def one_mode(
    url: str, nodes: list[Node], mode: str, rnd: int, args: argparse.Namespace
) -> list[Turn]:
    chats = [conversation(url, nodes, mode, rnd, i, args) for i in range(args.conversations)]
    return [turn for turns in await asyncio.gather(*chats) for turn in turns]


async def warm(nodes: list[Node], max_tokens: int) -> None:
    """The system prompt once on each node, straight to its frontend."""
    async with aiohttp.ClientSession() as http:
        for node in nodes:
            body = {"prompt": SYSTEM + user_turn("Hello!"), "max_tokens": max_tokens}
            assert (await stream_request(http, node.url, body)).status == 200


def summary(mode: str, rnd: int | str, turns: list[Turn]) -> dict[str, Any]:
    later = [t for t in turns if t.turn > 0]
    before = {(t.conversation, t.round, t.turn): t.node for t in turns}
    same = [t for t in later if before[(t.conversation, t.round, t.turn - 1)] == t.node]
    ttft = [t.result.ttft for t in turns if t.result.ttft is not None]

    def hit_rate(chosen: list[Turn]) -> float:
        prompt = sum(t.result.prompt_tokens for t in chosen)
        return round(sum(t.result.cached_tokens for t in chosen) / prompt, 3) if prompt else 0.0

    return {
        "mode": mode,
        "round": rnd,
        "turns": len(turns),
        "prompt_tokens": sum(t.result.prompt_tokens for t in turns),
        "cached_tokens": sum(t.result.cached_tokens for t in turns),
        "hit_rate": hit_rate(turns),
        "hit_rate_turn2plus": hit_rate(later),
        "same_node_turn2plus": round(len(same) / len(later), 3) if later else 0.0,
        "turns_on_node0": sum(1 for t in turns if t.node == 0),
        "ttft_p50_s": round(percentile(ttft, 0.5), 3),
        "ttft_p95_s": round(percentile(ttft, 0.95), 3),
    }


def plot(rows: list[dict[str, Any]]) -> Path:
    totals = {r["mode"]: r for r in rows if r["round"] == "all"}

    def draw(axes: list[Any]) -> None:
        hits, ttft = axes
        hits.bar(MODES, [totals[m]["hit_rate_turn2plus"] for m in MODES], color=["C0", "C1"])
        hits.set(ylabel="cached / prompt tokens, turns 2+", ylim=(0, 1), title="prefix hits")
        for offset, key in ((-0.2, "ttft_p50_s"), (0.2, "ttft_p95_s")):
            xs = [i + offset for i in range(len(MODES))]
            ttft.bar(xs, [totals[m][key] for m in MODES], 0.4, label=key[5:8])
        ttft.set(xticks=range(len(MODES)), xticklabels=MODES, ylabel="TTFT (s)", title="TTFT")
        ttft.legend()

    return save_plot("affinity", draw, panels=2, width=4.5)


def run(args: argparse.Namespace) -> list[Turn]:
    flags = ("--threads", str(args.threads))
    nodes = [start_node(*flags), start_node(*flags)]
    server: Nginx | None = None
    try:
        progress(f"nodes up on {nodes[0].url} and {nodes[1].url}")
        workdir = Path(tempfile.mkdtemp(prefix="tinyserve-bench-nginx-"))
        specs = [f"127.0.0.1:{node.port}" for node in nodes]
        server = Nginx(workdir, *specs, options=["--affinity"]).start()
        if args.system:
            asyncio.run(warm(nodes, args.max_tokens))
        turns: list[Turn] = []
        for rnd in range(args.rounds):
            for mode in MODES if rnd % 2 == 0 else reversed(MODES):
                done = asyncio.run(one_mode(server.url, nodes, mode, rnd, args))
                progress(f"round {rnd} {mode}: {summary(mode, rnd, done)}")
                turns += done
        return turns
    finally:
        if server is not None:
            server.stop()
        for node in nodes:
            node.stop(check=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--conversations", type=int, default=4, help="K, run at once")
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=32, help="per reply")
    parser.add_argument("--rounds", type=int, default=2, help="each mode once per round")
    parser.add_argument("--threads", type=int, default=1, help="llama.cpp threads per node")
    parser.add_argument(
        "--system", action="store_true", help="start every conversation with one system prompt"
    )
    args = parser.parse_args()
    assert find_nginx() is not None, "nginx is not installed (make test-deps installs it)"
    turns = run(args)
    rows = [
        summary(mode, rnd, [t for t in turns if t.mode == mode and t.round == rnd])
        for rnd in range(args.rounds)
        for mode in MODES
    ]
    rows += [summary(mode, "all", [t for t in turns if t.mode == mode]) for mode in MODES]
    report("affinity", rows)
    write_csv("affinity_turns", [turn_row(t) for t in turns])
    rr, aff = rows[-2:]
    print(
        f"affinity vs round robin: hit rate (turns 2+) {rr['hit_rate_turn2plus']} -> "
        f"{aff['hit_rate_turn2plus']}; TTFT p50 {rr['ttft_p50_s']} -> {aff['ttft_p50_s']} s "
        f"({aff['ttft_p50_s'] / rr['ttft_p50_s']:.2f}x), p95 {rr['ttft_p95_s']} -> "
        f"{aff['ttft_p95_s']} s ({aff['ttft_p95_s'] / rr['ttft_p95_s']:.2f}x)"
    )
    print(f"wrote {plot(rows)}")


def turn_row(t: Turn) -> dict[str, Any]:
    r = t.result
    return {
        "mode": t.mode,
        "round": t.round,
        "conversation": t.conversation,
        "turn": t.turn,
        "node": t.node,
        "prompt_tokens": r.prompt_tokens,
        "cached_tokens": r.cached_tokens,
        "ttft_s": round(r.ttft, 4) if r.ttft is not None else "",
    }


if __name__ == "__main__":
    main()
