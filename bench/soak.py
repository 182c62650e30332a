"""Soak and chaos: mixed load through two frontends, one engine ``kill -9`` and restart.

For ``--duration`` seconds, ``--clients`` loops send a random mix (native, OpenAI completions
and chat; streaming or not) to either frontend; some are over budget (``max_tokens`` over the
limit, a prompt longer than a slot's context: 400 expected), some are cut by the client
after a few events or a short wait, and every ``--burst-every`` seconds a burst of
``--burst`` long streams asks for more than the slots and the queue hold (503 queue_full
expected). Halfway through, the engine is SIGKILLed and a new ``tinyserve engine`` started
with the same runtime dir and flags, as systemd's ``Restart=`` would (the frontends keep
running and reconnect).

Every request ends in exactly one outcome: rejected (by reason), completed, failed (a final
error event, or an error reply after the engine took it), cut (our own disconnect), or lost
(accepted but no final event, or no answer at all). RSS of both frontends and of each engine
incarnation is sampled every second; "base" is the sample ``--warmup`` seconds into an
incarnation's load (allocator arenas and caches fill first), "end" the last one. At the end the
board must be idle (no running or waiting request, no KV block used).

Exit status 1 if anything was lost, RSS grew past ``--rss-bound-mib`` from base to end in any
process, or the board did not return to idle. Loopback only; bounded by ``--duration``.

    .venv/bin/python bench/soak.py [--duration 300] [--clients 6] [--seed 1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from common import ROOT  # noqa: F401  (puts the repository on sys.path)

from tests.integration.units import UnitNode

MAX_TOKENS_LIMIT = 256
# A request's limit; 4 slots of it are the 2048 cells the one shared pool had before issue 32.
CTX_PER_SLOT = 512
ENGINE_FLAGS = ("--slots", "4", "--ctx-per-slot", str(CTX_PER_SLOT), "--max-queue", "8")
FRONTEND_FLAGS = ("--max-tokens-limit", str(MAX_TOKENS_LIMIT))
ADMISSION = {"queue_full", "draining"}
REQUEST_TIMEOUT_S = 180.0  # a request with no answer by then is lost (a hang)
PROMPTS = (
    "Write a story about a robot who learns to paint. Once upon a time,",
    "1, 2, 3, 4, 5,",
    "The capital of France is",
    "List three colours:",
)
KINDS = (  # (route, stream, weight)
    ("/generate", True, 30),
    ("/generate", False, 15),
    ("/v1/completions", True, 15),
    ("/v1/completions", False, 10),
    ("/v1/chat/completions", True, 20),
    ("/v1/chat/completions", False, 10),
)


@dataclass
class Plan:
    """One request to send, and whether (and when) the client will walk away from it."""

    route: str
    stream: bool
    body: dict[str, Any]
    cut_after_events: int | None = None  # streams: close after this many events
    cut_after_s: float | None = None  # JSON: give up after this long


@dataclass
class Tally:
    """Outcomes of every request sent."""

    outcomes: Counter[str] = field(default_factory=Counter)
    rejected: Counter[str] = field(default_factory=Counter)
    accepted: int = 0
    unanswered: int = 0  # lost without any HTTP reply

    @property
    def sent(self) -> int:
        return sum(self.outcomes.values())


def plan(rng: random.Random, model: str, over_budget: float, cut: float) -> Plan:
    route, stream = rng.choices([k[:2] for k in KINDS], [k[2] for k in KINDS])[0]
    prompt = rng.choice(PROMPTS)
    max_tokens = rng.randint(4, 40)
    if rng.random() < over_budget:
        if rng.random() < 0.5:
            max_tokens = MAX_TOKENS_LIMIT + rng.randint(1, 1000)  # 400: over the limit
        else:
            prompt = "word " * (CTX_PER_SLOT + 64)  # 400: cannot fit a slot's context
    body: dict[str, Any] = {"max_tokens": max_tokens, "stream": stream}
    body["ignore_eos"] = rng.random() < 0.5
    if route == "/generate":
        body["prompt"] = prompt
    elif route == "/v1/completions":
        body.update(model=model, prompt=prompt)
    else:
        body.update(model=model, messages=[{"role": "user", "content": prompt}])
    request = Plan(route, stream, body)
    if rng.random() < cut:
        if stream:
            request.cut_after_events = rng.randint(1, 6)
        else:
            request.cut_after_s = rng.uniform(0.05, 1.5)
    return request


def final_of(event: Any) -> str | None:
    """'completed' or 'failed' if ``event`` (one SSE data payload) ends its request."""
    if not isinstance(event, dict):
        return None
    if "error" in event:
        return "failed"
    if "finish_reason" in event:  # native
        return "failed" if event["finish_reason"] == "error" else "completed"
    choices = event.get("choices") or []
    if choices and choices[0].get("finish_reason") is not None:
        return "completed"
    return None


async def read_stream(resp: aiohttp.ClientResponse, cut_after: int | None) -> str:
    """Read SSE events until the final one; 'cut' if we close first, 'lost' if it ends without."""
    events, outcome = 0, None
    async for line in resp.content:
        if not line.startswith(b"data:"):
            continue
        payload = line[5:].strip()
        if payload == b"[DONE]":
            break
        events += 1
        outcome = outcome or final_of(json.loads(payload))
        if outcome is not None and not resp.url.path.startswith("/v1/"):
            break  # native: the final event is the last one
        if outcome is None and cut_after is not None and events >= cut_after:
            resp.close()
            return "cut"
    return outcome or "lost"


def reason_of(body: Any) -> str:
    error = body.get("error", {}) if isinstance(body, dict) else {}
    return str(error.get("reason") or error.get("code") or error.get("type") or "unknown")


async def send(session: aiohttp.ClientSession, url: str, request: Plan, tally: Tally) -> float:
    """Send ``request`` and count its one outcome; returns the Retry-After of a 503 (else 0)."""
    answered: list[float] = []  # the HTTP status and Retry-After, once a reply came
    limit = REQUEST_TIMEOUT_S if request.cut_after_s is None else request.cut_after_s
    try:
        outcome = await asyncio.wait_for(_exchange(session, url, request, tally, answered), limit)
    except TimeoutError:
        outcome = "lost" if request.cut_after_s is None else "cut"
    # A dropped connection or a reply that is not what the API promises: nothing to count on.
    except (aiohttp.ClientError, ValueError):
        outcome = "lost"
    if outcome == "lost" and not answered:
        tally.unanswered += 1
    tally.outcomes[outcome] += 1
    return answered[1] if len(answered) > 1 else 0.0


async def _exchange(
    session: aiohttp.ClientSession, url: str, request: Plan, tally: Tally, answered: list[int]
) -> str:
    async with session.post(url + request.route, json=request.body) as resp:
        answered += [resp.status, float(resp.headers.get("Retry-After", 0))]
        if resp.status == 200:
            tally.accepted += 1
            if request.stream:
                return await read_stream(resp, request.cut_after_events)
            return final_of(await resp.json()) or "lost"
        body = await resp.json(content_type=None)
        reason = reason_of(body)
        # The engine took it and it failed later: a JSON reply is then its final word.
        if "X-Request-Id" in resp.headers and resp.status >= 500 and reason not in ADMISSION:
            tally.accepted += 1
            return "failed"
        tally.rejected[reason] += 1
        return "rejected"


async def client_loop(
    urls: list[str], model: str, tally: Tally, deadline: float, rng: random.Random, args: Any
) -> None:
    timeout = aiohttp.ClientTimeout(total=None)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        while time.monotonic() < deadline:
            request = plan(rng, model, args.over_budget, args.cut)
            retry_after = await send(session, rng.choice(urls), request, tally)
            # As a polite client does, though no longer than 2 s: the load must go on.
            await asyncio.sleep(min(retry_after, 2.0))


async def burst_loop(urls: list[str], tally: Tally, deadline: float, args: Any) -> None:
    """Bursts of long streams, more than the slots and the queue hold (503 queue_full for
    the rest); each accepted one is cut after its second event, so a burst costs little."""
    body = {"prompt": PROMPTS[1], "max_tokens": 240, "ignore_eos": True, "stream": True}
    async with aiohttp.ClientSession() as session:
        while time.monotonic() + args.burst_every < deadline:
            await asyncio.sleep(args.burst_every)
            requests = [Plan("/generate", True, body, 2) for _ in range(args.burst)]
            await asyncio.gather(
                *(send(session, urls[i % len(urls)], r, tally) for i, r in enumerate(requests))
            )


def rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


@dataclass
class Memory:
    """RSS samples (MiB) per process name, each incarnation of the engine on its own."""

    samples: dict[str, list[tuple[float, float]]] = field(default_factory=dict)

    def record(self, node: UnitNode, engine_name: str, started: float) -> None:
        now = time.monotonic() - started
        procs = [(engine_name, node.engine), *((f.name, f) for f in node.fronts)]
        for name, proc in procs:
            if proc.process is not None and proc.process.poll() is None:
                value = rss_mib(proc.pid)
                if value is not None:
                    self.samples.setdefault(name, []).append((now, value))


async def chaos(node: UnitNode, at_s: float, state: dict[str, Any]) -> None:
    """kill -9 the engine at ``at_s`` and start a new one (what Restart=on-failure does)."""
    await asyncio.sleep(at_s)
    killed = node.engine.kill9()
    state["engine"] = "engine (restarted)"  # its samples from its start on
    await asyncio.sleep(1.0)  # a restart delay, as RestartSec would give
    await asyncio.to_thread(lambda: node.engine.start().wait_for("READY=1"))
    state["engine"] = "engine (restarted)"
    state["restarted_at"] = time.monotonic()
    print(f"engine killed; new engine ready {time.monotonic() - killed:.2f} s later", flush=True)


async def sample_memory(
    node: UnitNode, memory: Memory, state: dict[str, Any], deadline: float
) -> None:
    started = state["started"]
    while time.monotonic() < deadline:
        memory.record(node, state["engine"], started)
        await asyncio.sleep(1.0)
    memory.record(node, state["engine"], started)


async def run_load(node: UnitNode, model: str, args: Any) -> tuple[Tally, Memory, dict[str, Any]]:
    tally, memory = Tally(), Memory()
    started = time.monotonic()
    deadline = started + args.duration
    state: dict[str, Any] = {"engine": "engine (first)", "started": started}
    rngs = [random.Random(args.seed * 1000 + i) for i in range(args.clients)]
    tasks = [client_loop(node.urls, model, tally, deadline, rng, args) for rng in rngs]
    await asyncio.gather(
        *tasks,
        burst_loop(node.urls, tally, deadline, args),
        chaos(node, args.duration * args.kill_at, state),
        sample_memory(node, memory, state, deadline),
    )
    return tally, memory, state


def growth(samples: list[tuple[float, float]], base_at: float) -> tuple[float, float, float]:
    """(base, end, end - base) of one process's samples; base is the first at/after base_at."""
    base = next((v for t, v in samples if t >= base_at), samples[-1][1])
    return base, samples[-1][1], samples[-1][1] - base


def report(tally: Tally, memory: Memory, state: dict[str, Any], idle: bool, args: Any) -> bool:
    print(f"\nrequests sent {tally.sent}, accepted {tally.accepted}")
    print(f"rejected {tally.outcomes['rejected']}: {dict(tally.rejected.most_common())}")
    for outcome in ("completed", "failed", "cut", "lost"):
        extra = f" (no HTTP answer: {tally.unanswered})" if outcome == "lost" else ""
        print(f"{outcome:>9} {tally.outcomes[outcome]}{extra}")
    ok = tally.outcomes["lost"] == 0 and idle
    restart = state.get("restarted_at", state["started"]) - state["started"]
    bound = args.rss_bound_mib
    print(f"\nRSS MiB (base: {args.warmup:.0f} s into each incarnation's load; bound +{bound:.0f})")
    for name, samples in sorted(memory.samples.items()):
        if not samples:
            continue
        begins = restart if name == "engine (restarted)" else 0.0
        base, end, grew = growth(samples, begins + args.warmup)
        flag = "" if grew <= args.rss_bound_mib else "  OVER BOUND"
        ok = ok and grew <= args.rss_bound_mib
        print(f"{name:>26}: start {samples[0][1]:7.1f}  base {base:7.1f}  end {end:7.1f}  "
              f"growth {grew:+6.1f}{flag}")  # fmt: skip
    print(f"\nboard idle at the end (running 0, waiting 0, blocks used 0): {idle}")
    print("PASS" if ok else "FAIL")
    return ok


def wait_idle(node: UnitNode, timeout_s: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        snap = node.snapshot()
        if not (snap.running or snap.waiting or snap.blocks_used):
            return True
        time.sleep(0.1)
    return False


async def served_model(url: str) -> str:
    async with aiohttp.ClientSession() as session, session.get(f"{url}/v1/models") as resp:
        return str((await resp.json())["data"][0]["id"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=300.0, help="seconds of load")
    parser.add_argument("--clients", type=int, default=6, help="concurrent client loops")
    parser.add_argument("--burst", type=int, default=24, help="streams in one burst")
    parser.add_argument("--burst-every", type=float, default=20.0, help="seconds")
    parser.add_argument("--over-budget", type=float, default=0.1, help="share over budget")
    parser.add_argument("--cut", type=float, default=0.1, help="share the client cuts")
    parser.add_argument("--kill-at", type=float, default=0.5, help="engine kill, share of run")
    parser.add_argument("--warmup", type=float, default=10.0, help="seconds before RSS base")
    parser.add_argument("--rss-bound-mib", type=float, default=16.0)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="tinyserve-soak-"))
    node = UnitNode(workdir, 2, engine_flags=ENGINE_FLAGS, frontend_flags=FRONTEND_FLAGS).start()
    print(f"node up: engine + 2 frontends ({workdir}); {args.duration:.0f} s of load", flush=True)
    try:
        model = asyncio.run(served_model(node.urls[0]))
        tally, memory, state = asyncio.run(run_load(node, model, args))
        idle = wait_idle(node)
        ok = report(tally, memory, state, idle, args)
    finally:
        codes = node.stop()
    print(f"exit codes: {codes}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
