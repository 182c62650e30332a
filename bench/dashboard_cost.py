"""What the dashboard's event feed costs: per engine pass in-process, and throughput at c=8
through a real node with and without dashboards open, interleaved in one run.

In-process (the default model is not loaded): the check every pass makes when nobody watches
(``if feed.until_ns``), and with a lease, folding a busy tick into the pending update
(``EventFeed.observe``) and building plus encoding one update (``take`` + ``encode``, at most
ten a second).

Through a node (one engine, ``--frontends`` frontends, the server's default threads):
``--rounds`` rounds of each arm, alternating: C streaming clients run ``--requests`` requests
of ``--max-tokens`` tokens; in the "viewers" arm ``--viewers`` SSE clients read
``GET /v1/events`` for the whole round and ``GET /metrics`` every ``--scrape-s`` (10 s, as
the page does).
Prints each round's generated tok/s, both medians and their ratio.

    .venv/bin/python bench/dashboard_cost.py [--rounds 3] [--viewers 2]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import time
from collections.abc import Callable

import aiohttp
from common import start_node, stream_request, write_csv

from tinyserve import protocol
from tinyserve.engine.output.events import EventFeed
from tinyserve.engine.output.report import RULE_ARRIVAL, Batch, Grant, Load, TickReport
from tinyserve.engine.request.sequence import Sequence, SequenceStatus

PROMPT = "Write a story about a robot who learns to paint. Once upon a time,"


def per_call_us(fn: Callable[[], object], n: int) -> float:
    started = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - started) / n * 1e6


def in_process(n: int) -> dict[str, float]:
    """Per-call costs of the feed's engine side, in microseconds."""
    load = Load(1, 10, 8, 256, 40, 12, 1.0)
    updates = [protocol.RequestUpdate(f"r{i}", 1, token_ids=[7]) for i in range(8)]
    tick = TickReport(load, {"f" * 32: updates}, batch=Batch(8, 8, 0, 8, 0.02))
    tick.grants = [Grant("r0", RULE_ARRIVAL, "default", 0, 0.01)]
    submit = protocol.Submit("r", "f" * 32, [1] * 60, protocol.SamplingParams(), 64)
    slots = [Sequence(submit, i, status=SequenceStatus.DECODE) for i in range(8)]
    waiting = [Sequence(submit, i) for i in range(10)]
    off = EventFeed()
    on = EventFeed()
    on.lease("f" * 32, 10.0, time.monotonic_ns())

    def check() -> None:
        if off.until_ns:  # what proc.py does each pass when nobody watches
            raise AssertionError

    def update() -> None:
        protocol.encode(on.take(time.monotonic_ns(), slots, waiting, load))

    return {
        "no_viewer_check_us": per_call_us(check, n),
        "observe_us": per_call_us(lambda: on.observe(tick, time.monotonic_ns()), n),
        "update_us": per_call_us(update, n // 10),
    }


async def view(url: str, stop: asyncio.Event, counts: list[int], scrape_s: float) -> None:
    """One dashboard: read the feed until ``stop``, counting updates, and read /metrics every
    ``scrape_s`` as the page does (for the rejections; 0: never)."""
    async with aiohttp.ClientSession() as session, session.get(f"{url}/v1/events") as resp:
        assert resp.status == 200, await resp.text()
        reader = asyncio.ensure_future(_count(resp, counts))
        while scrape_s and not stop.is_set():
            async with session.get(f"{url}/metrics") as metrics:
                await metrics.read()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), scrape_s)
        await stop.wait()
        reader.cancel()


async def _count(resp: aiohttp.ClientResponse, counts: list[int]) -> None:
    async for line in resp.content:
        if line.startswith(b"event: update"):
            counts[0] += 1


async def one_round(url: str, args: argparse.Namespace, viewers: int) -> tuple[float, int]:
    """(generated tok/s, updates the viewers received) of one round."""
    stop = asyncio.Event()
    counts = [0]
    watching = [
        asyncio.ensure_future(view(url, stop, counts, args.scrape_s)) for _ in range(viewers)
    ]
    await asyncio.sleep(0.5 if viewers else 0)  # the viewers are connected
    body = {"prompt": PROMPT, "max_tokens": args.max_tokens, "ignore_eos": True}
    left = args.requests
    tokens = 0
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:

        async def client() -> None:
            nonlocal left, tokens
            while left > 0:
                left -= 1
                result = await stream_request(session, url, body)
                tokens += result.tokens  # after the await: += would read tokens before it

        started = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(args.concurrency)))
        elapsed = time.perf_counter() - started
    stop.set()
    await asyncio.gather(*watching)
    return tokens / elapsed, counts[0]


async def through_node(url: str, args: argparse.Namespace) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    await one_round(url, args, 0)  # warm-up, not counted
    for round_no in range(args.rounds):
        for viewers in (0, args.viewers) if round_no % 2 == 0 else (args.viewers, 0):
            tok_s, updates = await one_round(url, args, viewers)
            rows.append({"round": round_no, "viewers": viewers, "tok_s": round(tok_s, 1),
                         "updates": updates})  # fmt: skip
            print(f"round {round_no}  viewers={viewers}  {tok_s:6.1f} tok/s  "
                  f"({updates} updates read)", flush=True)  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--viewers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--frontends", type=int, default=1)
    parser.add_argument(
        "--scrape-s", type=float, default=10.0, help="viewers read /metrics this often (0: never)"
    )
    parser.add_argument("--passes", type=int, default=100_000)
    args = parser.parse_args()
    costs = in_process(args.passes)
    print(
        f"engine pass, nobody watching (one attribute test): {costs['no_viewer_check_us']:.3f} us"
    )
    print(f"engine pass, watched: fold a tick of 8 requests:   {costs['observe_us']:.2f} us")
    print(f"one update (8 slots, 10 waiting), built + encoded: {costs['update_us']:.1f} us")
    node = start_node("--slots", "8", frontends=args.frontends)
    try:
        rows = asyncio.run(through_node(node.url, args))
    finally:
        node.stop(check=False)
    write_csv("dashboard_cost", rows)
    alone = statistics.median(float(r["tok_s"]) for r in rows if r["viewers"] == 0)  # type: ignore[arg-type]
    watched = statistics.median(float(r["tok_s"]) for r in rows if r["viewers"])  # type: ignore[arg-type]
    print(f"c={args.concurrency}: median {alone:.1f} tok/s without dashboards, {watched:.1f} with "
          f"{args.viewers} open; ratio {watched / alone:.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
