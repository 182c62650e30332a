"""A py-spy session (``--native``) of the engine and one frontend under sustained load, checked
against the engine's own tick metrics. The write-up is docs/profiling.md.

Starts a node with one frontend, runs ``--clients`` closed-loop streaming clients, and while
they run samples the engine and the frontend for ``--seconds`` each at ``--rate`` Hz with
``py-spy record --native --idle --format raw`` (collapsed stacks; ``--idle`` keeps the samples
of a thread that waits, so shares are of wall time). From each process's main-thread
samples: the share inside ``llama_decode``, and the innermost Python functions where the rest
goes. From /metrics over a window inside the sampled one (py-spy stops the process while
it attaches, which would stretch the tick in progress): the sum of
``tinyserve_decode_step_seconds`` (the engine times each ``llama_decode`` call) divided by
the window, which should agree with the engine's sampled share. Writes
bench/results/profile_engine.txt and profile_frontend.txt (the collapsed stacks) and
profile.csv, profile.png.

    .venv/bin/python bench/profile.py                       # 30 s each at 100 Hz
    .venv/bin/python bench/profile.py --seconds 12 --threads 1   # short
    .venv/bin/python bench/profile.py --breakdown       # the last run's samples by place
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
from common import (
    RESULTS,
    metric_sum,
    progress,
    prompt_of,
    save_plot,
    scrape,
    start_node,
    stream_request,
    write_csv,
)

DECODE = "llama_decode"
MAIN = "_run_module_as_main"  # python -m: the main thread's outermost Python frame


def py_spy() -> str:
    found = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(found).exists():
        raise SystemExit("py-spy is not installed: pip install -e '.[bench]'")
    return found


ATTACH_S = 4.0  # py-spy --native stops the process while it reads its symbols: not counted


def record(pid: int, seconds: float, rate: int, out: Path) -> subprocess.Popen[bytes]:
    """py-spy sampling ``pid`` for ``ATTACH_S`` + ``seconds`` + 2 s, started now."""
    duration = int(ATTACH_S + seconds + 2)
    cmd = [py_spy(), "record", "--native", "--idle", "--format", "raw", "--rate", str(rate),
           "--duration", str(duration), "--pid", str(pid), "--output", str(out)]  # fmt: skip
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def stacks(path: Path) -> Counter[str]:
    """Collapsed stacks (``frame;frame;... count``) as {stack: samples}."""
    counts: Counter[str] = Counter()
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            counts[stack] += int(count)
    return counts


def function(frame: str) -> str:
    """``name (file.py:12)`` -> ``name (file.py)``: the line numbers split one function."""
    return re.sub(r":\d+\)", ")", frame)


def shares(counts: Counter[str]) -> dict[str, Any]:
    """Of the main thread's samples (its stacks start in ``runpy``; the process's other
    threads, idle ones included, are left out): the share inside ``llama_decode``, and the
    innermost Python functions of the rest."""
    mine = {s: c for s, c in counts.items() if MAIN in s}
    total = sum(mine.values()) or 1
    decode = sum(c for s, c in mine.items() if DECODE in s)
    leaves: Counter[str] = Counter()
    for s, c in mine.items():
        if DECODE in s:
            continue
        python = [f for f in s.split(";") if ".py" in f]  # the innermost Python frame
        leaves[function(python[-1]) if python else function(s.split(";")[-1])] += c
    others = sum(counts.values()) - sum(mine.values())
    return {"samples": total, "other_threads": others, "decode_share": decode / total,
            "top": leaves.most_common(8)}  # fmt: skip


def timed_scrape(url: str) -> tuple[dict[str, float], float]:
    """/metrics and the time it reflects: the middle of the request (on a busy machine a
    scrape takes long enough to matter in a window of seconds)."""
    sent = time.perf_counter()
    metrics = scrape(url)
    return metrics, (sent + time.perf_counter()) / 2


def breakdown(counts: Counter[str], top: int = 12) -> list[tuple[str, int, float]]:
    """The main thread's samples by where they were: inside ``llama_decode`` by the innermost
    ggml function (``decode:NAME``), elsewhere by the innermost Python function."""
    where: Counter[str] = Counter()
    for stack, n in counts.items():
        if MAIN not in stack:
            continue
        frames = stack.split(";")
        if DECODE in stack:
            ggml = [f for f in frames if "libggml" in f and not f.startswith("0x")]
            where["decode:" + (ggml[-1] if ggml else frames[-1]).split(" ")[0]] += n
        else:
            python = [f for f in frames if ".py" in f]
            where[function(python[-1]) if python else frames[-1]] += n
    total = sum(where.values()) or 1
    return [(name, n, n / total) for name, n in where.most_common(top)]


def print_breakdowns() -> None:
    for name in ("engine", "frontend"):
        print(f"{name}: main thread's samples by place")
        for place, n, share in breakdown(stacks(RESULTS / f"profile_{name}.txt")):
            print(f"  {n:6d} {share:6.1%}  {place}")


async def load(url: str, clients: int, stop: threading.Event) -> int:
    done = 0
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=900)) as session:

        async def client(i: int) -> None:
            nonlocal done
            n = 0
            while not stop.is_set():
                n += 1
                body = {"prompt": prompt_of(48, i * 100_000 + n), "max_tokens": 96,
                        "ignore_eos": True}  # fmt: skip
                result = await stream_request(session, url, body)
                done += result.status == 200

        await asyncio.gather(*(client(i) for i in range(clients)))
    return done


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--rate", type=int, default=100)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--breakdown", action="store_true", help="only analyse the last run")
    args = parser.parse_args()
    if args.breakdown:
        print_breakdowns()
        return
    node = start_node("--threads", str(args.threads), "--slots", "8")
    stop = threading.Event()
    loader = threading.Thread(target=lambda: asyncio.run(load(node.url, args.clients, stop)))
    rows = []
    try:
        engine = node.engine_pid()
        frontend = next(p for p in node.children if p != engine)
        loader.start()
        time.sleep(3)  # every client streaming
        for name, pid in (("engine", engine), ("frontend", frontend)):
            out = RESULTS / f"profile_{name}.txt"
            progress(f"py-spy on the {name} (pid {pid}) for {args.seconds:.0f} s")
            spy = record(pid, args.seconds, args.rate, out)
            time.sleep(ATTACH_S)
            before, started = timed_scrape(node.url)
            time.sleep(args.seconds)
            after, ended = timed_scrape(node.url)
            assert spy.wait() == 0, f"py-spy failed on pid {pid}"
            wall = ended - started
            timed = metric_sum(after, "tinyserve_decode_step_seconds_sum") - metric_sum(
                before, "tinyserve_decode_step_seconds_sum"
            )
            sampled = shares(stacks(out))
            rows.append({
                "process": name,
                "main_thread_samples": sampled["samples"],
                "other_thread_samples": sampled["other_threads"],
                "sampled_decode_share": round(sampled["decode_share"], 3),
                # /metrics is served by a frontend: read through the one being stopped for
                # samples, its timing is not to be trusted (it came out above 1).
                "metrics_decode_share": round(timed / wall, 3) if name == "engine" else None,
                "window_s": round(wall, 1),
                "top_outside_decode": "; ".join(f"{f} {c}" for f, c in sampled["top"][:5]),
            })  # fmt: skip
            progress(f"{name}: {rows[-1]}")
    finally:
        stop.set()
        loader.join(timeout=300)
        node.stop(check=False)
    print(f"wrote {write_csv('profile', rows)}")

    def draw(ax: Any) -> None:
        x = range(len(rows))
        ax.bar([i - 0.2 for i in x], [r["sampled_decode_share"] for r in rows], 0.4,
               label="py-spy: samples in llama_decode")  # fmt: skip
        ax.bar([i + 0.2 for i in x], [r["metrics_decode_share"] or 0 for r in rows], 0.4,
               label="engine metrics: decode seconds / window")  # fmt: skip
        ax.set(xticks=list(x), xticklabels=[r["process"] for r in rows], ylabel="share of wall")
        ax.legend()

    print(f"wrote {save_plot('profile', draw)}")
    print_breakdowns()


if __name__ == "__main__":
    main()
