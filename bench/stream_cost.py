"""One stream at a time, against llama-server: the time per token and every process's CPU per
token, at each llama.cpp thread count.

The closed-loop c=1 comparison (``vs_llama_server.py``) leaves TinyServe a few per cent behind.
This script says where that goes. For each ``--threads`` value it starts both servers (as
``vs_llama_server.py`` does, one node with ``--frontends`` frontends) and, in ``--rounds``
alternating rounds, sends ``--requests`` streaming ``/v1/completions`` requests of ``--tokens``
greedy tokens each (``ignore_eos``, so every request is that long) to each, one at a time. Per
round and server: wall milliseconds per token (the request's time after its first token over
the tokens after the first) and the CPU milliseconds per token, user and system, of each
process (from ``/proc``: llama-server; TinyServe's engine, frontends and supervisor) and of
this client process (the same client for both). In the same run a fresh process times bare
``llama_decode`` steps (``raw.py``: one sequence, llama.cpp's greedy sampler chain, no server)
at each thread count, for reference, and another runs the same requests through TinyServe's
engine core alone (``EngineCore.step`` in-process: scheduling, batch, decode, sampling, no
sockets and no frontend), so the node's time per token splits into the core's and the
plumbing's. Prints medians over rounds and the ratio of wall time per token, TinyServe /
llama-server; writes bench/results/stream_cost.csv (``--name``). For a TinyServe node, the
round's mean ``llama_decode`` call from its own metrics (``tinyserve_decode_step_seconds``)
too: with one stream a step is one token, so the wall time per token less that is what the
engine does around the model each tick plus what the other processes take from it.

llama.cpp's threads spin while they wait, so the engine's and llama-server's CPU is mostly
threads x wall time; what tells is the CPU of everything else, which on a machine whose
cores llama.cpp's threads hold takes its time from them.

    .venv/bin/python bench/stream_cost.py                      # threads 1 and 2, ~6 min
    .venv/bin/python bench/stream_cost.py --threads 2 --rounds 3 --tokens 128
    .venv/bin/python bench/stream_cost.py --threads 2 --tinyserve-flag=--no-prefix-cache
    .venv/bin/python bench/stream_cost.py --threads 2 --baseline HEAD  # a change against HEAD

``--baseline COMMIT`` adds a third server to the rounds: a node running that commit's Python
code (``common.code_at``), so a change to the node is measured against the code before it in
the same run, and its ratio printed too.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import time
from pathlib import Path
from typing import Any

import aiohttp
from common import code_at, in_fresh_process, metric_sum, progress, scrape, write_csv
from vs_llama_server import (
    Server,
    model_id,
    start_llama_server,
    start_tinyserve,
    stream_openai,
    tinyserve_flag_argument,
)

from tests.integration.node import children_of

TICK_S = 1 / os.sysconf("SC_CLK_TCK")
PROMPT = "Request {i}: write a long story about a lighthouse keeper."
ROLES = ("llama", "frontend", "supervisor", "client")
BASELINE = "tinyserve-baseline"  # the server of ``--baseline``


def process_tree(root: int) -> list[int]:
    """``root`` and every process below it (from /proc)."""
    tree, frontier = [root], [root]
    while frontier:
        frontier = [child for pid in frontier for child in children_of(pid)]
        tree += frontier
    return tree


def role_of(pid: int) -> str:
    """``llama`` for the process that runs llama.cpp (llama-server, TinyServe's engine), else
    TinyServe's ``frontend`` or ``supervisor``."""
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    if b"tinyserve.cli" not in argv:
        return "llama"
    command = argv[argv.index(b"tinyserve.cli") + 1].decode()
    return {"engine": "llama", "frontend": "frontend"}.get(command, "supervisor")


def cpu_seconds(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of a process, all its threads."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) * TICK_S, int(fields[12]) * TICK_S


def cpu_by_role(pids: list[int]) -> dict[str, tuple[float, float]]:
    """Summed (user, system) CPU seconds per role (``ROLES``), this process as ``client``."""
    totals = dict.fromkeys(ROLES, (0.0, 0.0))
    for pid in pids:
        role, (user, system) = role_of(pid), cpu_seconds(pid)
        was = totals[role]
        totals[role] = (was[0] + user, was[1] + system)
    own = resource.getrusage(resource.RUSAGE_SELF)
    totals["client"] = (own.ru_utime, own.ru_stime)
    return totals


async def one_round(server: Server, pids: list[int], args: argparse.Namespace) -> dict[str, Any]:
    """``--requests`` streams one after another; wall and CPU per token after the first."""
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        if not server.model:
            server.model = await model_id(session, server.url)
        steps_before = _decode_steps(server)
        before = cpu_by_role(pids)
        decode_s, tokens = 0.0, 0
        for i in range(args.requests):
            body = {
                "prompt": PROMPT.format(i=i),
                "max_tokens": args.tokens,
                "ignore_eos": True,
            }
            sample = await stream_openai(session, server, "/v1/completions", body)
            if not sample.ok or sample.output_tokens != args.tokens:
                raise SystemExit(f"{server.name}: {sample.error or sample.output_tokens}")
            decode_s += sample.e2e - sample.ttft
            tokens += sample.output_tokens - 1
        after = cpu_by_role(pids)
        steps_after = _decode_steps(server)
    row: dict[str, Any] = {"ms_per_token": round(decode_s / tokens * 1e3, 3), "llama_decode_ms": ""}
    if steps_before is not None and steps_after is not None:
        (sum_0, count_0), (sum_1, count_1) = steps_before, steps_after
        row["llama_decode_ms"] = round((sum_1 - sum_0) / (count_1 - count_0) * 1e3, 3)
    for role in ROLES:
        for i, kind in enumerate(("user", "sys")):
            spent = after[role][i] - before[role][i]
            row[f"{role}_{kind}_ms"] = round(spent / tokens * 1e3, 3)
    return row


def _decode_steps(server: Server) -> tuple[float, float] | None:
    """(seconds, calls) of a TinyServe node's ``llama_decode`` so far; None for llama-server."""
    if not server.name.startswith("tinyserve"):
        return None
    metrics = scrape(server.url)
    series = "tinyserve_decode_step_seconds"
    return metric_sum(metrics, series + "_sum"), metric_sum(metrics, series + "_count")


def core_alone(tokens: int, threads: int, ctx_per_slot: int, slots: int, requests: int) -> float:
    """Milliseconds per token after the first of ``requests`` requests (after one to warm up)
    run one at a time through an ``EngineCore`` in this process, with the node's defaults."""
    import llama_cpp

    from tinyserve import protocol
    from tinyserve.config import build_config
    from tinyserve.engine.core import EngineCore
    from tinyserve.engine.runtime.runtime import LlamaRuntime, RuntimeSpec
    from tinyserve.model import resolve_model_path

    options = {"threads": threads, "ctx_per_slot": ctx_per_slot, "slots": slots}
    config = build_config(options, environ={})
    runtime = LlamaRuntime(RuntimeSpec.from_config(config))
    core = EngineCore(config, runtime)
    vocab = llama_cpp.Llama(str(resolve_model_path(None)), vocab_only=True, verbose=False)
    sampling = protocol.SamplingParams(ignore_eos=True)
    spent = 0.0
    for i in range(requests + 1):
        prompt = vocab.tokenize(PROMPT.format(i=i).encode(), add_bos=True, special=True)
        rid = f"r{i}"
        core.submit(protocol.Submit(rid, "f" * 32, prompt, sampling, tokens))
        first = 0.0
        while core.has_work():
            core.step()
            seq = core.scheduler.by_id.get(rid)
            if not first and seq is not None and seq.generated:
                first = time.perf_counter()
        if i:
            spent += time.perf_counter() - first
    runtime.close()
    return round(spent / (requests * (tokens - 1)) * 1e3, 3)


def at_threads(
    threads: int, args: argparse.Namespace, model_path: Path, baseline: Path | None
) -> list[dict[str, Any]]:
    server_args = argparse.Namespace(
        threads=threads, ctx_per_slot=args.ctx_per_slot, slots=args.slots, frontends=args.frontends,
        llama_server_flag=[], tinyserve_flag=args.tinyserve_flag,
    )  # fmt: skip
    ctx = args.ctx_per_slot  # one sequence: the bare context is one slot's cells
    bare = in_fresh_process("raw", "raw_single", [64], args.tokens, threads, ctx, 512)
    core = in_fresh_process(
        "stream_cost", "core_alone", args.tokens, threads, ctx, args.slots, args.requests
    )
    servers = [start_llama_server(server_args, model_path)]
    try:
        servers.append(start_tinyserve(server_args, model_path))
        if baseline is not None:
            servers.append(start_tinyserve(server_args, model_path, BASELINE, baseline))
        pids = {s.name: process_tree(s.pid) for s in servers}
        rows = []
        for r in range(args.rounds):
            for server in servers if r % 2 == 0 else servers[::-1]:
                progress(f"threads {threads} round {r + 1}/{args.rounds}: {server.name}")
                row = asyncio.run(one_round(server, pids[server.name], args))
                base = {"threads": threads, "round": r + 1, "server": server.name}
                ref = {"bare_ms": round(bare[0]["step_s"] * 1e3, 3), "core_ms": core}
                rows.append({**base, **ref, **row})
        return rows
    finally:
        for server in servers:
            server.stop()


def summary(rows: list[dict[str, Any]]) -> None:
    """Medians over rounds per server; the wall ratio per round, median [range]."""
    for threads in sorted({r["threads"] for r in rows}):
        mine = [r for r in rows if r["threads"] == threads]
        print(
            f"\n== threads {threads}: bare llama_decode {mine[0]['bare_ms']:.2f} ms per token, "
            f"engine core alone {mine[0]['core_ms']:.2f}"
        )
        for name in ("llama-server", "tinyserve", BASELINE):
            of = [r for r in mine if r["server"] == name]
            if not of:
                continue
            keys = [k for k, v in of[0].items()
                    if "ms" in k and v != "" and k not in ("bare_ms", "core_ms")]  # fmt: skip
            shown = ", ".join(f"{k} {statistics.median(r[k] for r in of):.3f}" for k in keys)
            print(f"  {name:>12}: {shown}")
        ratio(mine, "tinyserve", "llama-server")
        if any(r["server"] == BASELINE for r in mine):
            ratio(mine, "tinyserve", BASELINE)


def ratio(rows: list[dict[str, Any]], server: str, reference: str) -> None:
    """Throughput of ``server`` over ``reference``'s, round by round: median [range]."""
    ours = [r["ms_per_token"] for r in rows if r["server"] == server]
    theirs = [r["ms_per_token"] for r in rows if r["server"] == reference]
    ratios = [t / o for o, t in zip(ours, theirs, strict=True)]
    print(
        f"  throughput ratio {server} / {reference}: {statistics.median(ratios):.3f} "
        f"[{min(ratios):.3f}-{max(ratios):.3f}]"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", default="1,2", help="llama.cpp thread counts, in turn")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--requests", type=int, default=3, help="per round and server")
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--ctx-per-slot", type=int, default=4096, help="KV cells of each slot")
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--frontends", type=int, default=2)
    tinyserve_flag_argument(parser)
    parser.add_argument("--baseline", metavar="COMMIT", help="also run this commit's code")
    parser.add_argument("--name", default="stream_cost", help="the CSV's name in bench/results/")
    args = parser.parse_args()

    from tinyserve.model import resolve_model_path

    model_path = resolve_model_path(None)
    rows = []
    with code_at(args.baseline) as baseline:
        for threads in (int(t) for t in args.threads.split(",")):
            rows += at_threads(threads, args, model_path, baseline)
    summary(rows)
    print(f"wrote {write_csv(args.name, rows)}")


if __name__ == "__main__":
    main()
