"""Is a request sent the moment ``/ready`` says 200 served? (issue 33)

``tinyserve serve --frontends 2``: both frontends share the port (SO_REUSEPORT) and the
kernel hands each new connection to either. ``/ready`` is asked every 10 ms, each time on a
new connection, and the moment it says 200, ``--requests`` ``/generate`` requests go one
after another, each on a new connection too (as many clients would send them):

- ``start``: ``--starts`` fresh nodes, from the launch of ``tinyserve serve``;
- ``kill``: one node, ``--kills`` times: ``kill -9`` of the engine, ``/ready`` asked until
  it says anything but 200, then until it says 200 again (the launcher restarts the engine).

Prints, per code (this tree's, and ``--baseline COMMIT``'s run the same way, before it) and
phase: the requests sent, those served, the refusals by status and reason, and how many
starts or kills had any refusal. Nothing is written.

    .venv/bin/python bench/readiness.py [--starts 20] [--kills 10] [--requests 12]
        [--baseline COMMIT]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from common import code_at, progress

from tests.integration.node import Node
from tinyserve.procs import pid_alive

PROBE_EVERY_S = 0.01
WITHIN_S = 180.0
BODY = {"prompt": "The capital of France is", "max_tokens": 4}


@dataclass
class Tally:
    """One phase's requests: outcomes counted, and the rounds that had a refusal."""

    outcomes: Counter[str] = field(default_factory=Counter)
    rounds: int = 0
    rounds_refused: int = 0

    def add(self, outcomes: list[str]) -> None:
        self.outcomes.update(outcomes)
        self.rounds += 1
        self.rounds_refused += any(outcome != "200" for outcome in outcomes)

    def line(self, code: str, phase: str) -> str:
        sent = sum(self.outcomes.values())
        refused = ", ".join(
            f"{n} {what}" for what, n in sorted(self.outcomes.items()) if what != "200"
        )
        return (
            f"{code} | {phase} | {self.rounds} | {sent} | {self.outcomes['200']} | "
            f"{refused or '-'} | {self.rounds_refused}"
        )


async def outcome(session: aiohttp.ClientSession, method: str, url: str) -> str:
    """``200``, or the status and error reason, or ``no answer``."""
    try:
        async with session.request(method, url, json=BODY if method == "POST" else None) as resp:
            body = await resp.json(content_type=None)
    except aiohttp.ClientConnectionError:
        return "no answer"
    if resp.status == 200:
        return "200"
    return f"{resp.status} {(body.get('error') or {}).get('reason', '')}".strip()


async def until_ready(session: aiohttp.ClientSession, url: str, ready: bool) -> None:
    """Ask ``/ready`` until it says 200 (``ready``) or anything else (not ``ready``)."""
    deadline = time.monotonic() + WITHIN_S
    while ((await outcome(session, "GET", f"{url}/ready")) == "200") != ready:
        if time.monotonic() > deadline:
            raise RuntimeError(f"/ready did not become {'' if ready else 'not '}ready in time")
        await asyncio.sleep(PROBE_EVERY_S)


async def one_after_another(session: aiohttp.ClientSession, url: str, n: int) -> list[str]:
    return [await outcome(session, "POST", f"{url}/generate") for _ in range(n)]


def new_connections() -> aiohttp.ClientSession:
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(force_close=True),
        timeout=aiohttp.ClientTimeout(total=60),
    )


def node_at(code: Path | None, *flags: str) -> Node:
    workdir = Path(tempfile.mkdtemp(prefix="tinyserve-bench-"))
    return Node(workdir, "--threads", "0", *flags, frontends=2, code=code)


async def starts(code: Path | None, count: int, requests: int) -> Tally:
    tally = Tally()
    for i in range(count):
        node = node_at(code).launch()
        try:
            async with new_connections() as session:
                await until_ready(session, node.url, ready=True)
                tally.add(await one_after_another(session, node.url, requests))
            node.wait_ready()
        finally:
            node.stop(check=False)  # a failure's own error, not a leftover file's
        progress(f"start {i + 1}/{count}: {tally.outcomes}")
    return tally


async def live_engine(node: Node) -> int:
    """The pid of the node's engine once the board names a live one (the previous may be
    dead and its successor not up yet: a stale 200 from a frontend that had not noticed)."""
    deadline = time.monotonic() + WITHIN_S
    while not pid_alive(engine := node.engine_pid()):
        if time.monotonic() > deadline:
            raise RuntimeError("no live engine in time")
        await asyncio.sleep(PROBE_EVERY_S)
    return engine


async def kills(code: Path | None, count: int, requests: int) -> Tally:
    tally = Tally()
    # Every kill is a death the launcher counts against --restart-limit (5 in 120 s).
    node = node_at(code, "--restart-limit", str(count + 1)).start()
    try:
        async with new_connections() as session:
            for i in range(count):
                engine = await live_engine(node)
                os.kill(engine, signal.SIGKILL)
                await until_ready(session, node.url, ready=False)
                await until_ready(session, node.url, ready=True)
                tally.add(await one_after_another(session, node.url, requests))
                progress(f"kill {i + 1}/{count}: {tally.outcomes}")
    finally:
        node.stop(check=False)
    return tally


async def measure(args: argparse.Namespace) -> None:
    codes = [(f"baseline {args.baseline}", args.baseline)] if args.baseline else []
    lines = []
    for name, commit in [*codes, ("node", None)]:
        with code_at(commit) as code:
            lines.append((await starts(code, args.starts, args.requests)).line(name, "start"))
            lines.append((await kills(code, args.kills, args.requests)).line(name, "kill"))
    print("code | phase | rounds | requests | served | refused | rounds with a refusal")
    print("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--starts", type=int, default=20)
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--requests", type=int, default=12)
    parser.add_argument("--baseline", help="also measure this commit's code, first")
    asyncio.run(measure(parser.parse_args()))


if __name__ == "__main__":
    main()
