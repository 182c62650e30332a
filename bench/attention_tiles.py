"""What a tick's prompt rows cost by how llama.cpp splits them: pieces against attention tiles.

Bare llama.cpp as the engine sets it up (a KV stream of ``--ctx-per-slot`` cells per sequence,
``n_ubatch`` 512), no server, with flash attention on and off (``--flash-attn``). Two tables,
each step the median of ``--steps`` decodes (after an untimed one), the cells written dropped
again after each:

- **one piece**: one sequence holding ``context`` tokens writes a piece of ``n`` rows (logits on
  the last). Below ``TILE`` rows (``GGML_FA_TILE_Q``) the CPU backend's flash attention goes
  through a stream's rows one at a time; from it on, in tiles. Without it, attention is plain
  matmuls over the stream's cells.
- **one tick**: four sequences at ``context``; the rows of a tick as the engine plans it, one
  decode row for each of three and prompt pieces beside them: llama.cpp's ``split_equal`` makes a
  ubatch of as many rows of each sequence, so pieces of unlike lengths leave a ubatch of their
  difference (the plans before ``engine/scheduling/pieces.py`` against those after).

    .venv/bin/python bench/attention_tiles.py --context 256,1000,4500
    .venv/bin/python bench/attention_tiles.py --flash-attn on   # one mode only
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import time
from typing import Any

from common import in_fresh_process, write_csv
from throughput import _fill, bare_llama, fill_context

PIECES = (1, 8, 32, 48, 63, 64, 96, 128)
# A tick's prompt pieces beside three decode rows (sequences 1-3), by sequence.
TICKS = {
    "three decode rows": {},
    "128": {0: 128},
    "128 + 61 (before)": {0: 128, 1: 61},
    "128 + 28 (before)": {0: 128, 1: 28},
    "128 + 4 (before)": {0: 128, 1: 4},
    "66 + 66 (after)": {0: 66, 1: 66},
    "96 + 96 (after)": {0: 96, 1: 96},
}


def piece_times(context: int, steps: int, threads: int, cells: int, fa: str) -> list[float]:
    """Median seconds of one sequence's piece of ``n`` rows at ``context``, for each ``PIECES``."""
    import llama_cpp

    times = []
    with bare_llama(cells, 512, 1, False, threads, fa) as (lctx, lbatch):
        memory = llama_cpp.llama_get_memory(lctx)
        fill_context(lctx, lbatch, 0, context)
        for n in PIECES:
            rows = [(1000 + i % 300, context + i, 0, i == n - 1) for i in range(n)]
            times.append(_median(lctx, lbatch, rows, steps, lambda: _drop(memory, 1, context)))
    return times


def tick_times(context: int, steps: int, threads: int, cells: int, fa: str) -> list[float]:
    """Median seconds of each of ``TICKS`` at ``context``: three decode rows and the pieces."""
    import llama_cpp

    times = []
    with bare_llama(4 * cells, 512, 4, False, threads, fa) as (lctx, lbatch):
        memory = llama_cpp.llama_get_memory(lctx)
        for seq in range(4):
            fill_context(lctx, lbatch, seq, context)
        for pieces in TICKS.values():
            rows = [(1000, context, seq, True) for seq in (1, 2, 3) if seq not in pieces]
            for seq, n in pieces.items():
                rows += [(1000 + i % 300, context + i, seq, i == n - 1) for i in range(n)]
            rows.sort(key=lambda row: row[2])  # in sequence order, as the engine writes them
            times.append(_median(lctx, lbatch, rows, steps, lambda: _drop(memory, 4, context)))
    return times


def _median(lctx: Any, lbatch: Any, rows: list, steps: int, drop: Any) -> float:
    import llama_cpp

    timed = []
    for step in range(steps + 1):  # the first warms the shapes up, untimed
        _fill(lbatch, rows)
        started = time.perf_counter()
        assert llama_cpp.llama_decode(lctx, lbatch) == 0
        if step:
            timed.append(time.perf_counter() - started)
        drop()
    return statistics.median(timed)


def _drop(memory: Any, sequences: int, context: int) -> None:
    import llama_cpp

    for seq in range(sequences):
        llama_cpp.llama_memory_seq_rm(memory, seq, context, -1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--context", default="256,1000,4500", help="tokens each sequence holds")
    parser.add_argument("--flash-attn", default="on,off", help="llama.cpp's flash attention")
    parser.add_argument("--steps", type=int, default=3, help="timed decodes per figure")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--ctx-per-slot", type=int, default=8192)
    args = parser.parse_args()
    table: list[dict[str, Any]] = []
    for fa, context in itertools.product(
        args.flash_attn.split(","), (int(c) for c in args.context.split(","))
    ):
        numbers = (context, args.steps, args.threads, args.ctx_per_slot, fa)
        at = f"fa {fa:3}  context {context:5}"
        for n, seconds in zip(
            PIECES, in_fresh_process("attention_tiles", "piece_times", *numbers), strict=True
        ):
            ms = seconds * 1000
            table.append({"flash_attn": fa, "table": "piece", "context": context, "tick": "",
                          "prompt_rows": n, "ms": round(ms, 1),
                          "ms_per_row": round(ms / n, 2)})  # fmt: skip
            print(f"{at}  piece of {n:3} rows  {ms:8.1f} ms  {ms / n:6.2f} ms a row")
        ticks = in_fresh_process("attention_tiles", "tick_times", *numbers)
        for name, seconds in zip(TICKS, ticks, strict=True):
            rows = sum(TICKS[name].values())
            table.append({"flash_attn": fa, "table": "tick", "context": context, "tick": name,
                          "prompt_rows": rows, "ms": round(seconds * 1000, 1),
                          "ms_per_row": ""})  # fmt: skip
            print(f"{at}  tick {name:20} {seconds * 1000:8.1f} ms")
    print(f"wrote {write_csv('attention_tiles', table)}")


if __name__ == "__main__":
    main()
