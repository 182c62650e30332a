"""What an embedding costs: TinyServe's ``/v1/embeddings`` beside llama-server's (built from the
same vendored llama.cpp, ``--embeddings --pooling mean``) and llama-cpp-python's own
``embed()`` in a process of its own, in one run, on the same model and threads.

Inputs are texts of about ``--tokens`` tokens. Two ways to send them, each for ``--rounds``
rounds with the servers' order alternating:

- ``list``: one client, ``--per-request`` inputs per request (a retrieval pipeline indexing);
- ``single``: ``--concurrency`` clients, one input per request, back to back (queries).

Figures: inputs per second, client milliseconds per input, request latency p50/p99.
``embed()`` runs the ``list`` load only (one caller). Then, TinyServe alone, what embedding
costs generation: the inter-token latency of a 128-token stream alone and while one client
sends ``list`` requests back to back (the engine runs one embedding batch per tick).
Writes ``bench/results/embeddings.csv``.

``--mixed``: TinyServe alone, the engine shared (issue 47). ``--streams`` clients each stream
``--stream-tokens`` greedy tokens back to back, and ``--clients`` clients each send
``--per-request`` inputs per request back to back, for ``--window`` seconds: the streams alone,
the embedding clients alone, then both at once (the embedding clients start first and go on
until the last stream ends; the embedding rate is the inputs of the requests that ended within
the window over the time to the last of them). Figures: the streams' ITL p50/p99 and time per
output token (a stream's pace: with speculation a chunk carries several tokens, so its gaps
are fewer and longer) and the embedding inputs per second, each beside the other against
alone, and every request that failed. ``--embedding-model PATH`` gives the node a second model
for the embeddings; ``--node-flags`` more flags. Writes ``bench/results/embeddings_mixed.csv``.

    .venv/bin/python bench/embeddings.py
    .venv/bin/python bench/embeddings.py --tokens 120 --per-request 32 --rounds 4
    .venv/bin/python bench/embeddings.py --stream-only    # the stream beside embeddings alone
    .venv/bin/python bench/embeddings.py --mixed --streams 1 --clients 4
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import statistics
import time
from pathlib import Path
from typing import Any

import aiohttp
from common import (
    in_fresh_process,
    mean,
    percentile,
    prompt_of,
    start_node,
    stream_request,
    write_csv,
)
from vs_llama_server import Server, launch_llama_server, llama_server_binary, model_id

SERVER_CTX = 512  # llama-server's cells per slot, and TinyServe's --embedding-max-tokens


def texts(count: int, tokens: int) -> list[str]:
    return [prompt_of(tokens, salt) for salt in range(count)]


def embed_in_process(model: str, count: int, tokens: int, per_request: int, threads: int) -> Any:
    """llama-cpp-python's ``embed()``: seconds per call of ``per_request`` inputs (run in a
    fresh interpreter by ``in_fresh_process``)."""
    import llama_cpp

    from tinyserve.engine.runtime.weights import model_params, repack_weights

    params = model_params(repack_weights("auto"))
    llama_cpp.llama_cpp.llama_model_default_params = lambda: params  # weights as the engine's
    llm = llama_cpp.Llama(
        model,
        embedding=True,
        pooling_type=llama_cpp.LLAMA_POOLING_TYPE_MEAN,
        flash_attn=True,
        n_ctx=SERVER_CTX,
        n_batch=SERVER_CTX,
        n_seq_max=32,
        n_threads=threads,
        n_threads_batch=threads,
        verbose=False,
    )
    inputs = texts(count, tokens)
    seconds = []
    for start in range(0, count, per_request):
        began = time.perf_counter()
        llm.embed(inputs[start : start + per_request])
        seconds.append(time.perf_counter() - began)
    llm.close()
    return seconds


def start_llama_server(model: Path, args: argparse.Namespace) -> Server:
    from tests.integration.node import free_port
    from tinyserve.engine.runtime.weights import repack_weights

    port = free_port()
    flags = [
        "-m", str(model), "-t", str(args.threads), "-tb", str(args.threads),
        "--embeddings", "--pooling", "mean",
        "-np", "4", "-c", str(4 * SERVER_CTX), "-b", str(SERVER_CTX), "-ub", str(SERVER_CTX),
        *([] if repack_weights("auto") else ["--no-repack"]),
    ]  # fmt: skip
    return launch_llama_server(port, flags, "llama-server-embeddings.log")


def start_tinyserve(model: Path, args: argparse.Namespace) -> Server:
    flags = ["--model", str(model), "--threads", str(args.threads), "--slots", "4"]
    flags += ["--ctx-per-slot", "1024", "--embedding-max-tokens", str(SERVER_CTX)]
    node = start_node(*flags, "--max-queue", "1024", frontends=args.frontends)
    return Server("tinyserve", node.url, pid=node.process.pid, stop=lambda: node.stop(False))


async def post_embeddings(
    session: aiohttp.ClientSession, server: Server, inputs: list[str]
) -> float:
    body = {"model": server.model, "input": inputs, "encoding_format": "float"}
    began = time.perf_counter()
    async with session.post(f"{server.url}/v1/embeddings", json=body) as resp:
        reply = await resp.json()
        if resp.status != 200 or len(reply["data"]) != len(inputs):
            raise SystemExit(f"{server.name}: {resp.status} {str(reply)[:300]}")
    return time.perf_counter() - began


async def load(
    server: Server, kind: str, inputs: list[str], args: argparse.Namespace
) -> dict[str, float]:
    """One round of ``kind`` on ``server``: its figures."""
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    async with aiohttp.ClientSession(connector=connector) as session:
        if not server.model:
            server.model = await model_id(session, server.url)
        latencies: list[float] = []
        began = time.perf_counter()
        if kind == "list":
            for start in range(0, len(inputs), args.per_request):
                batch = inputs[start : start + args.per_request]
                latencies.append(await post_embeddings(session, server, batch))
        else:
            queue = list(inputs)

            async def client() -> None:
                while queue:
                    latencies.append(await post_embeddings(session, server, [queue.pop()]))

            await asyncio.gather(*(client() for _ in range(args.concurrency)))
        seconds = time.perf_counter() - began
    return figures(seconds, latencies, len(inputs))


def figures(seconds: float, latencies: list[float], inputs: int) -> dict[str, float]:
    return {
        "inputs_per_s": round(inputs / seconds, 2),
        "ms_per_input": round(1000 * seconds / inputs, 2),
        "request_p50_ms": round(1000 * percentile(latencies, 0.5), 1),
        "request_p99_ms": round(1000 * percentile(latencies, 0.99), 1),
    }


async def stream_gaps(server: Server, busy: bool, args: argparse.Namespace) -> list[float]:
    """Gaps between the chunks of one 128-token greedy stream; with ``busy``, while one client
    sends ``list`` requests back to back."""
    inputs = texts(args.per_request, args.tokens)
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    async with aiohttp.ClientSession(connector=connector) as session:
        if not server.model:
            server.model = await model_id(session, server.url)
        done = asyncio.Event()

        async def embedder() -> None:
            while not done.is_set():
                await post_embeddings(session, server, inputs)

        background = asyncio.create_task(embedder()) if busy else None
        body = {
            "model": server.model, "max_tokens": 128, "temperature": 0, "stream": True,
            "ignore_eos": True, "messages": [{"role": "user", "content": "Tell me a story."}],
        }  # fmt: skip
        gaps: list[float] = []
        last = None
        async with session.post(f"{server.url}/v1/chat/completions", json=body) as resp:
            async for line in resp.content:
                if line.startswith(b"data:") and b"[DONE]" not in line:
                    now = time.perf_counter()
                    if last is not None:
                        gaps.append(now - last)
                    last = now
        done.set()
        if background is not None:
            await background
    return gaps


async def mixed_phase(
    url: str, streams: int, clients: int, args: argparse.Namespace
) -> dict[str, Any]:
    """``streams`` stream clients and ``clients`` embedding clients for ``--window`` seconds:
    the streams' gaps, the inputs embedded within the window, the requests that failed."""
    inputs = texts(args.per_request, args.tokens)
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    gaps: list[float] = []
    paces: list[float] = []  # each stream's time per token after its first
    embedded, failed, last_end = [0], [0], [0.0]
    async with aiohttp.ClientSession(connector=connector) as session:
        streams_done = asyncio.Event()
        began = time.perf_counter()
        stop = began + args.window

        async def streamer(index: int) -> None:
            while time.perf_counter() < stop:
                body = {
                    "prompt": prompt_of(32, 1000 + index), "max_tokens": args.stream_tokens,
                    "temperature": 0, "ignore_eos": True,
                }  # fmt: skip
                result = await stream_request(session, url, body)
                failed[0] += result.status != 200 or result.tokens != args.stream_tokens
                gaps.extend(result.gaps)
                if result.tokens > 1:
                    paces.append(sum(result.gaps) / (result.tokens - 1))

        async def embedder() -> None:
            body = {"input": inputs, "encoding_format": "base64"}
            while not (streams_done.is_set() or (not streams and time.perf_counter() > stop)):
                async with session.post(f"{url}/v1/embeddings", json=body) as resp:
                    reply = await resp.json()
                if resp.status != 200 or len(reply.get("data", ())) != len(inputs):
                    failed[0] += 1
                elif time.perf_counter() <= stop:
                    embedded[0] += len(inputs)
                    last_end[0] = time.perf_counter()

        tasks = [asyncio.create_task(embedder()) for _ in range(clients)]
        await asyncio.sleep(0.5 if clients else 0)  # the embedding load is on when streams begin
        await asyncio.gather(*(streamer(i) for i in range(streams)))
        streams_done.set()
        await asyncio.gather(*tasks)
    rate = embedded[0] / (last_end[0] - began) if embedded[0] else 0.0
    return {
        "itl_p50_ms": round(1000 * percentile(gaps, 0.5), 2) if gaps else None,
        "itl_p99_ms": round(1000 * percentile(gaps, 0.99), 2) if gaps else None,
        "tpot_ms": round(1000 * mean(paces), 2) if paces else None,
        "gaps": len(gaps),
        # by the last request that ended in the window: requests of many inputs end in
        # clusters, and a count over the whole window would move in steps of a cluster
        "inputs_per_s": round(rate, 2) if clients else None,
        "failed": failed[0],
    }


def run_mixed(model: Path, args: argparse.Namespace) -> None:
    """The mixed workload on one node: streams alone, embeddings alone, both."""
    flags = ["--model", str(model), "--threads", str(args.threads), "--max-queue", "1024"]
    if args.embedding_model:
        flags += ["--embedding-model", str(args.embedding_model)]
    node = start_node(*flags, *args.node_flags.split(), frontends=args.frontends)
    rows = []
    try:
        for r in range(args.rounds):
            for name, streams, clients in (
                ("streams alone", args.streams, 0),
                ("embeddings alone", 0, args.clients),
                ("both", args.streams, args.clients),
            ):
                got = asyncio.run(mixed_phase(node.url, streams, clients, args))
                rows.append({"phase": name, "round": r + 1, **got})
                print(f"round {r + 1} {name}: {got}", flush=True)
    finally:
        node.stop(False)
    path = write_csv("embeddings_mixed", rows)
    second = f", embeddings on {args.embedding_model}" if args.embedding_model else ""
    print(
        f"\nmodel {model.name}{second}; threads {args.threads}; {args.streams} streams of "
        f"{args.stream_tokens} tokens; {args.clients} embedding clients x {args.per_request} "
        f"inputs of ~{args.tokens} tokens; {args.window} s windows; flags {args.node_flags!r}"
    )
    for r in range(args.rounds):
        alone, embeds, both = rows[3 * r : 3 * r + 3]
        p50 = (both["itl_p50_ms"] or 0) / (alone["itl_p50_ms"] or math.inf)
        p99 = (both["itl_p99_ms"] or 0) / (alone["itl_p99_ms"] or math.inf)
        pace = (both["tpot_ms"] or 0) / (alone["tpot_ms"] or math.inf)
        rate = both["inputs_per_s"] / (embeds["inputs_per_s"] or math.inf)
        print(
            f"round {r + 1}: ITL p50 {alone['itl_p50_ms']} -> {both['itl_p50_ms']} ms "
            f"({p50:.2f}x), p99 {alone['itl_p99_ms']} -> {both['itl_p99_ms']} ms ({p99:.2f}x), "
            f"TPOT {alone['tpot_ms']} -> {both['tpot_ms']} ms ({pace:.2f}x); "
            f"embeddings {embeds['inputs_per_s']} -> {both['inputs_per_s']} inputs/s "
            f"({rate:.2f}x); failed {sum(row['failed'] for row in (alone, embeds, both))}"
        )
    print(f"wrote {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--inputs", type=int, default=128, help="texts per round")
    parser.add_argument("--tokens", type=int, default=60, help="about this many tokens each")
    parser.add_argument("--per-request", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--frontends", type=int, default=1)
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument(
        "--stream-only", action="store_true", help="only a stream's ITL, alone and beside"
    )
    parser.add_argument("--mixed", action="store_true", help="streams and embeddings at once")
    parser.add_argument("--streams", type=int, default=1, help="--mixed: stream clients")
    parser.add_argument("--clients", type=int, default=4, help="--mixed: embedding clients")
    parser.add_argument("--stream-tokens", type=int, default=256)
    parser.add_argument("--window", type=float, default=30.0, help="--mixed: seconds a phase")
    parser.add_argument("--embedding-model", type=Path, default=None)
    parser.add_argument("--node-flags", default="", help="--mixed: more flags for the node")
    args = parser.parse_args()

    from tinyserve.model import resolve_model_path

    model = resolve_model_path(str(args.model) if args.model else None)
    if args.mixed:
        run_mixed(model, args)
        return
    llama_server_binary()
    inputs = texts(args.inputs, args.tokens)
    rows: list[dict[str, Any]] = []
    if args.stream_only:
        args.rounds = 0
    for r in range(args.rounds):
        seconds = in_fresh_process(
            "embeddings", "embed_in_process", str(model), args.inputs, args.tokens,
            args.per_request, args.threads,
        )  # fmt: skip
        got = figures(sum(seconds), seconds, args.inputs)
        rows.append({"server": "embed()", "load": "list", "round": r + 1, **got})
    servers = [start_tinyserve(model, args)]
    if not args.stream_only:
        servers.insert(0, start_llama_server(model, args))
    try:
        for kind in ("list", "single"):
            for r in range(args.rounds):
                for server in servers if r % 2 == 0 else servers[::-1]:
                    got = asyncio.run(load(server, kind, inputs, args))
                    rows.append({"server": server.name, "load": kind, "round": r + 1, **got})
                    print(f"{kind} round {r + 1}: {server.name} {got}", flush=True)
        tinyserve = servers[-1]
        alone = asyncio.run(stream_gaps(tinyserve, False, args))
        busy = asyncio.run(stream_gaps(tinyserve, True, args))
    finally:
        for server in servers:
            server.stop()
    streams = [
        {"stream": name, "itl_mean_ms": round(1000 * mean(gaps), 1),
         "itl_p99_ms": round(1000 * percentile(gaps, 0.99), 1)}
        for name, gaps in (("alone", alone), ("beside embedding", busy))
    ]  # fmt: skip
    path = write_csv("embeddings_stream", streams)
    if rows:
        path = write_csv("embeddings", rows)
    print(
        f"\nmodel {model.name}; threads {args.threads}; {args.inputs} inputs of ~{args.tokens} "
        f"tokens; list: {args.per_request} per request; single: {args.concurrency} clients"
    )
    for kind in ("list", "single"):
        for name in ("embed()", "llama-server", "tinyserve"):
            of = [row for row in rows if row["server"] == name and row["load"] == kind]
            if of:
                rate = statistics.median(row["inputs_per_s"] for row in of)
                ms = statistics.median(row["ms_per_input"] for row in of)
                p50 = statistics.median(row["request_p50_ms"] for row in of)
                print(f"{kind:6} {name:12} {rate:8.1f} inputs/s {ms:7.2f} ms/input  p50 {p50} ms")
    for name, gaps in (("alone", alone), ("beside embedding", busy)):
        ms, p99 = 1000 * mean(gaps), 1000 * percentile(gaps, 0.99)
        print(f"stream ITL {name}: mean {ms:.1f} ms, p99 {p99:.1f} ms")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
