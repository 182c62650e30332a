"""CPU used by an idle node: the engine and each frontend, as a share of one core.

Starts a node (one engine, two frontends), lets it settle, then reads each process's
utime + stime from /proc over a window with no requests.

    .venv/bin/python bench/idle_cpu.py [--seconds 30]
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from common import start_node, write_csv

from tests.integration.node import children_of

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime


def name_of(pid: int) -> str:
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    return "engine" if b"engine" in argv else "frontend"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    args = parser.parse_args()
    node = start_node(frontends=2)
    try:
        time.sleep(5)  # start-up work (model load, handshakes) is not idle time
        pids = children_of(node.process.pid)  # type: ignore[union-attr]
        before = {pid: cpu_seconds(pid) for pid in pids}
        started = time.monotonic()
        time.sleep(args.seconds)
        elapsed = time.monotonic() - started
        rows = []
        for pid in pids:
            share = (cpu_seconds(pid) - before[pid]) / elapsed
            rows.append(
                {"process": name_of(pid), "pid": pid, "core_percent": round(100 * share, 2)}
            )
            print(
                f"{rows[-1]['process']:>8} pid {pid}: {100 * share:.2f}% of one core "
                f"over {elapsed:.0f} s idle"
            )
    finally:
        node.stop(check=False)
    print(f"wrote {write_csv('idle_cpu', rows)}")


if __name__ == "__main__":
    main()
