"""Pieces every bench script shares: one streaming request with its timings, percentiles,
CSV output, and starting a node for the run."""

from __future__ import annotations

import csv
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
sys.path.insert(0, str(ROOT))
from tests.integration.node import Node  # noqa: E402


@dataclass
class Result:
    """What one request saw: HTTP status, rejection reason, time to first text, gaps after."""

    status: int = 0
    reason: str = ""
    finish_reason: str = ""
    ttft: float | None = None
    gaps: list[float] = field(default_factory=list)
    tokens: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    seconds: float = 0.0


async def stream_request(
    session: aiohttp.ClientSession,
    url: str,
    body: dict[str, Any],
    text_sink: list[str] | None = None,
    text_times: list[float] | None = None,
) -> Result:
    """POST /generate as a stream and time it; the text goes to ``text_sink`` and the arrival
    time of each text event to ``text_times`` if given (both filled as the stream goes)."""
    result = Result()
    sent = last = time.perf_counter()
    async with session.post(f"{url}/generate", json={**body, "stream": True}) as resp:
        result.status = resp.status
        if resp.status != 200:
            result.reason = (await resp.json()).get("error", {}).get("reason", "")
            return result
        async for line in resp.content:
            if not line.startswith(b"data:"):
                continue
            event = json.loads(line[5:])
            now = time.perf_counter()
            if event.get("text"):
                if text_sink is not None:
                    text_sink.append(event["text"])
                if text_times is not None:
                    text_times.append(now)
                if result.ttft is None:
                    result.ttft = now - sent
                else:
                    result.gaps.append(now - last)
                last = now
            if "finish_reason" in event:
                usage = event.get("usage", {})
                result.finish_reason = event["finish_reason"]
                result.tokens = usage.get("completion_tokens", 0)
                result.prompt_tokens = usage.get("prompt_tokens", 0)
                result.cached_tokens = usage.get("cached_tokens", 0)
    result.seconds = time.perf_counter() - sent
    return result


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile; NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def write_csv(name: str, rows: list[dict[str, Any]]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.csv"
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def start_node(*flags: str, frontends: int = 1) -> Node:
    """A fresh node in a temp dir for this bench run, with the server's own default thread
    count (the test helper would otherwise pin llama.cpp to one thread)."""
    threads = () if "--threads" in flags else ("--threads", "0")
    workdir = Path(tempfile.mkdtemp(prefix="tinyserve-bench-"))
    return Node(workdir, *threads, *flags, frontends=frontends).start()


def wait_idle(node: Node) -> None:
    """Until the node's engine holds no request (read from its board)."""
    from tinyserve_native.board import Board

    board = Board.attach(str(node.runtime_dir / "board"))
    try:
        while (snap := board.snapshot()).running or snap.waiting or snap.blocks_used:
            time.sleep(0.05)
    finally:
        board.close()
