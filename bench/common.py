"""Pieces every bench script shares: one streaming request with its timings, percentiles,
CSV output, and starting a node for the run."""

from __future__ import annotations

import contextlib
import csv
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
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
    timeline: dict[str, Any] | None = None  # the engine's, when the request asked for it


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
                result.timeline = event.get("timeline")
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


def in_fresh_process(module: str, function: str, *args: Any) -> Any:
    """``module.function(*args)`` (a bench/ module) in a fresh interpreter, so that its
    model, memory and threads are gone afterwards; its JSON result."""
    code = (
        f"import sys, json; sys.path.insert(0, {str(ROOT / 'bench')!r}); "
        f"import {module}; print(json.dumps({module}.{function}(*{args!r})))"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def write_csv(name: str, rows: list[dict[str, Any]]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.csv"
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def report(name: str, rows: list[dict[str, Any]]) -> Path:
    """Print ``rows`` as a table (a header line, then one line per row) and write the CSV."""
    print(" | ".join(rows[0]))
    for row in rows:
        print(" | ".join(str(v) for v in row.values()))
    path = write_csv(name, rows)
    print(f"wrote {path}")
    return path


def start_node(*flags: str, frontends: int = 1, code: Path | None = None) -> Node:
    """A fresh node in a temp dir for this bench run, with the server's own default thread
    count (the test helper would otherwise pin llama.cpp to one thread); ``code``: run the
    Python code there (``code_at``) instead of this tree's."""
    threads = () if "--threads" in flags else ("--threads", "0")
    workdir = Path(tempfile.mkdtemp(prefix="tinyserve-bench-"))
    return Node(workdir, *threads, *flags, frontends=frontends, code=code).start()


@contextlib.contextmanager
def code_at(commit: str | None) -> Iterator[Path | None]:
    """A folder from which a node runs the Python code of ``commit`` (its ``tinyserve``,
    ``engine`` and ``frontend`` from a temporary git worktree), for a before/after in one
    run; the native modules stay this tree's build, so a commit whose ``.pyx`` files differ
    is not measured as it was. No commit: None, this tree's code."""
    if commit is None:
        yield None
        return
    with tempfile.TemporaryDirectory(prefix="tinyserve-code-") as tmp:
        checkout = Path(tmp) / "checkout"
        git = ["git", "-C", str(ROOT), "worktree"]
        subprocess.run([*git, "add", "--detach", str(checkout), commit], check=True,
                       capture_output=True)  # fmt: skip
        try:
            package = Path(tmp) / "path" / "tinyserve"
            package.mkdir(parents=True)
            for module in (checkout / "tinyserve").iterdir():
                (package / module.name).symlink_to(module)
            (package / "engine").symlink_to(checkout / "engine")
            (package / "frontend").symlink_to(checkout / "frontend")
            yield package.parent
        finally:
            subprocess.run([*git, "remove", "--force", str(checkout)], check=True)


def wait_idle(node: Node) -> None:
    """Until the node's engine holds no request (read from its board)."""
    from tinyserve_native.board import Board

    board = Board.attach(str(node.runtime_dir / "board"))
    try:
        while (snap := board.snapshot()).running or snap.waiting or snap.blocks_used:
            time.sleep(0.05)
    finally:
        board.close()


# Each of these is one token of the default model's vocabulary after a space.
_WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "that",
    "for",
    "it",
    "as",
    "was",
    "with",
    "be",
    "by",
    "on",
    "not",
    "he",
    "this",
    "are",
    "or",
    "his",
    "from",
    "at",
    "which",
    "but",
    "have",
    "an",
    "they",
    "you",
    "were",
    "her",
    "she",
    "there",
    "had",
    "one",
    "all",
    "we",
    "their",
]


def prompt_of(tokens: int, salt: int) -> str:
    """A prompt of about ``tokens`` tokens (exactly, for the default model, from 12 up),
    distinct per ``salt`` from its start, so that no two share a cached prefix."""
    head = f"Request {salt}:"  # about 8 tokens with the BOS the frontend adds
    body = [_WORDS[(salt + i) % len(_WORDS)] for i in range(max(tokens - 8, 1))]
    return " ".join([head, *body])


def post_json(url: str, body: dict[str, Any], headers_only: bool = False) -> tuple[int, Any]:
    """POST ``body`` as JSON without a session: (status, parsed reply), errors included; with
    ``headers_only`` a success returns once the headers are in (reply None) and hangs up."""
    import urllib.error
    import urllib.request

    data = json.dumps(body).encode()
    request = urllib.request.Request(url, data, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=1800) as resp:
            return resp.status, None if headers_only else json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def get_json(url: str) -> Any:
    import urllib.request

    with urllib.request.urlopen(url, timeout=60) as resp:
        return json.loads(resp.read())


def scrape(url: str) -> dict[str, float]:
    """``GET /metrics`` as {series: value}; a series is the name with its labels as printed
    (``tinyserve_kv_blocks_used``, ``tinyserve_requests_total{code="200",...}``)."""
    import urllib.request

    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as resp:
        text = resp.read().decode()
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            series, _, value = line.rpartition(" ")
            values[series] = float(value)
    return values


def metric_sum(metrics: dict[str, float], name: str) -> float:
    """The sum of every series of ``name`` (all label sets); 0 when there is none."""
    return sum(v for k, v in metrics.items() if k == name or k.startswith(name + "{"))


def save_plot(name: str, draw: Any, *, panels: int = 1, width: float = 6.0) -> Path:
    """A PNG under bench/results: ``draw(axes)`` fills a row of ``panels`` axes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, panels, figsize=(width * panels, 4), squeeze=False)
    draw(list(axes[0]) if panels > 1 else axes[0][0])
    fig.tight_layout()
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def progress(message: str) -> None:
    """One progress line, with the time since the script started."""
    print(f"[{time.perf_counter() - _STARTED:7.1f}s] {message}", flush=True)


_STARTED = time.perf_counter()
