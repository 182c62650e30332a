"""CPU and memory of an idle node: the engine and each frontend, as a share of one core and
as resident memory.

Starts a node (one engine, two frontends), lets it settle, then reads each process's
utime + stime from /proc over a window with no requests, and its resident set (VmRSS) at
the end. ``--baseline COMMIT`` measures that commit's code the same way first
(``common.code_at``: its Python code on this tree's native build, so only a commit whose
native modules and flags match today's: one from before issue 32 does not start), and
``--flags`` are given to both nodes.

    .venv/bin/python bench/idle_cpu.py [--seconds 30]
    .venv/bin/python bench/idle_cpu.py --baseline f48e435 --flags="--ctx-per-slot 512"
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from common import code_at, start_node, write_csv

from tests.integration.node import children_of

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime


def name_of(pid: int) -> str:
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    return "engine" if b"engine" in argv else "frontend"


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def measure(label: str, flags: list[str], seconds: float, code: Path | None) -> list[dict]:
    node = start_node(*flags, frontends=2, code=code)
    rows = []
    try:
        time.sleep(5)  # start-up work (model load, handshakes) is not idle time
        pids = children_of(node.process.pid)  # type: ignore[union-attr]
        before = {pid: cpu_seconds(pid) for pid in pids}
        started = time.monotonic()
        time.sleep(seconds)
        elapsed = time.monotonic() - started
        for pid in pids:
            share = (cpu_seconds(pid) - before[pid]) / elapsed
            row = {
                "code": label,
                "process": name_of(pid),
                "pid": pid,
                "core_percent": round(100 * share, 2),
                "rss_mib": round(rss_mib(pid), 1),
            }
            rows.append(row)
            print(
                f"{label:>10} {row['process']:>8} pid {pid}: {100 * share:.2f}% of one core "
                f"over {elapsed:.0f} s idle, {row['rss_mib']} MiB resident"
            )
    finally:
        node.stop(check=False)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--baseline", default=None, help="a commit to measure first")
    parser.add_argument("--flags", default="", help="flags for both nodes")
    args = parser.parse_args()
    flags = args.flags.split()
    rows = []
    if args.baseline:
        with code_at(args.baseline) as code:
            rows += measure(args.baseline, flags, args.seconds, code)
    rows += measure("this tree", flags, args.seconds, None)
    print(f"wrote {write_csv('idle_cpu', rows)}")


if __name__ == "__main__":
    main()
