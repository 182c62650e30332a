"""TinyServe against llama.cpp's own ``llama-server``, side by side, in one run.

Builds ``llama-server`` once from the llama.cpp sources vendored in the installed
llama-cpp-python (its sdist, unpacked and compiled under ``build/llama-server/``), starts it and
a TinyServe node with matching settings (model, llama.cpp threads, slots, batch, and the same
KV cells per slot: ``-c`` is ``--slots`` x ``--ctx-per-slot`` for llama-server, whose slots
then have a stream of cells each, as TinyServe's), and drives both with the same streaming
OpenAI-API client, alternately (A then B, then B then A), for ``--rounds`` rounds of every load
point:

- ``closed``: C clients each sending requests back to back (C from ``--concurrency``);
- ``poisson``: requests arriving at random (exponential gaps) at each rate of ``--rates``;
- ``prefix``: closed loop at the largest C, every prompt one system prompt + its own question;
- ``chat``: closed loop at the largest C, each client a conversation of ``--turns`` turns
  on ``/v1/chat/completions`` (the history grows; the prefix cache should carry it).

Figures as ``vllm bench serve`` defines them: request and output-token throughput; TTFT;
TPOT (time per output token after the first); ITL (gaps between streamed chunks); end-to-end
latency; p50/p90/p99 of each; goodput (requests per second that met every ``--slo-*``). Ratios
are TinyServe / llama-server per round, printed as the median and the range over rounds.
Writes ``bench/results/vs_llama_server.csv`` (one row per server, load point and round) and
``vs_llama_server.png`` (matplotlib, from the ``bench`` extra that ``make bench`` installs).

    .venv/bin/python bench/vs_llama_server.py                       # everything, ~25 min
    .venv/bin/python bench/vs_llama_server.py --workloads closed --concurrency 8 --rounds 4
    .venv/bin/python bench/vs_llama_server.py --workloads chat --max-tokens 256
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tarfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from common import ROOT, percentile, save_plot, start_node, write_csv

BUILD = ROOT / "build" / "llama-server"
TOPICS = [
    "a lighthouse keeper", "a lost robot", "the first snowfall", "a market at dawn",
    "an old violin", "a city under the sea", "a clockmaker's apprentice", "a desert train",
    "a garden on the moon", "a quiet library", "a storm at sea", "a fox and a crow",
    "the last bakery", "a mountain village", "a paper airplane", "a river that ran uphill",
]  # fmt: skip
SYSTEM = (
    "You are a patient assistant for a small public library. You answer questions about "
    "opening hours, borrowing rules, the reading room, events for children, and the local "
    "history collection. Keep answers short and friendly, say when you do not know, and "
    "never invent a book that is not in the catalogue. The library opens at nine on weekdays "
    "and at ten on Saturdays; it is closed on Sundays. A card lets you borrow up to eight "
    "books for three weeks, renewable twice unless someone else has reserved the book. "
)
QUESTIONS = [
    "When do you open on Saturday?", "How many books can I borrow?", "Can I renew a book?",
    "Is there a reading room?", "Do you have events for children?", "Are you open Sunday?",
    "How long is the loan period?", "What happens if a book is reserved?",
]  # fmt: skip


# --- the two servers ------------------------------------------------------------------------


def llama_server_binary() -> Path:
    """``llama-server`` built from the installed llama-cpp-python's own llama.cpp (once)."""
    from importlib.metadata import version

    release = version("llama_cpp_python")
    binary = BUILD / f"llama.cpp-{release}" / "bin" / "llama-server"
    if binary.exists():
        return binary
    BUILD.mkdir(parents=True, exist_ok=True)
    sdist = BUILD / f"llama_cpp_python-{release}.tar.gz"
    if not sdist.exists():
        print(f"fetching the llama-cpp-python {release} sources", flush=True)
        pip = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:"]
        subprocess.run([*pip, f"llama-cpp-python=={release}", "-d", str(BUILD)], check=True)
    source = BUILD / f"llama_cpp_python-{release}"
    if not source.exists():
        with tarfile.open(sdist) as tar:
            tar.extractall(BUILD, filter="data")
    work = BUILD / f"cmake-{release}"
    print(f"building llama-server {release} (several minutes on 2 cores)", flush=True)
    # llama-cpp-python's own build on Linux: Release, llama.cpp's defaults otherwise
    # (GGML_NATIVE and OpenMP on), curl off.
    configure = ["cmake", "-S", str(source / "vendor" / "llama.cpp"), "-B", str(work)]
    flags = ["-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF"]
    subprocess.run([*configure, *flags, "-DLLAMA_BUILD_EXAMPLES=OFF"], check=True)
    jobs = str(len(os.sched_getaffinity(0)))
    subprocess.run(
        ["cmake", "--build", str(work), "--target", "llama-server", "-j", jobs], check=True
    )
    binary.parent.mkdir(parents=True, exist_ok=True)
    for built in (work / "bin").iterdir():  # the server and the shared libraries it loads
        shutil.copy2(built, binary.parent / built.name)
    return binary


@dataclass
class Server:
    name: str
    url: str
    model: str = ""  # the id its /v1/models reports
    pid: int = 0  # the process that started it (TinyServe: the supervisor of the node)
    stop: Callable[[], None] = lambda: None


def start_llama_server(args: argparse.Namespace, model_path: Path) -> Server:
    from tests.integration.node import free_port
    from tinyserve.engine.runtime.weights import repack_weights

    port = free_port()
    flags = [
        "-m", str(model_path), "-t", str(args.threads), "-tb", str(args.threads),
        "-c", str(args.slots * args.ctx_per_slot), "-np", str(args.slots),
        "-b", "512", "-ub", "512",
        *([] if repack_weights("auto") else ["--no-repack"]),  # weights loaded as ours are
        *args.llama_server_flag,
    ]  # fmt: skip
    return launch_llama_server(port, flags, "llama-server.log")


def launch_llama_server(port: int, flags: list[str], log_name: str) -> Server:
    """llama-server on 127.0.0.1:``port`` with ``flags``, its output in ``BUILD/log_name``;
    returns once it answers ``/health`` (exits the script if it never does)."""
    log = open(BUILD / log_name, "w")  # noqa: SIM115 (closed by stop)
    argv = [str(llama_server_binary()), "--host", "127.0.0.1", "--port", str(port), *flags]
    env = {**os.environ, "LD_LIBRARY_PATH": str(Path(argv[0]).parent)}
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)

    def stop() -> None:
        proc.terminate()
        proc.wait(30)
        log.close()

    server = Server("llama-server", f"http://127.0.0.1:{port}", pid=proc.pid, stop=stop)
    deadline = time.monotonic() + 180
    while not _healthy(server.url):
        if proc.poll() is not None or time.monotonic() > deadline:
            stop()
            raise SystemExit(f"llama-server did not start; see {log.name}")
        time.sleep(0.5)
    return server


def start_tinyserve(
    args: argparse.Namespace, model_path: Path, name: str = "tinyserve", code: Path | None = None
) -> Server:
    """A node with ``args``' settings; ``code``: another version's (``common.code_at``)."""
    flags = ["--model", str(model_path), "--threads", str(args.threads)]
    flags += ["--ctx-per-slot", str(args.ctx_per_slot), "--slots", str(args.slots)]
    flags += ["--max-queue", "1024", *args.tinyserve_flag]
    node = start_node(*flags, frontends=args.frontends, code=code)
    return Server(name, node.url, pid=node.process.pid, stop=lambda: node.stop(check=False))


def _healthy(url: str) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


async def model_id(session: aiohttp.ClientSession, url: str) -> str:
    async with session.get(f"{url}/v1/models") as resp:
        return str((await resp.json())["data"][0]["id"])


# --- one request ----------------------------------------------------------------------------


@dataclass
class Sample:
    """One streamed request as the client saw it."""

    ok: bool = False
    error: str = ""  # why it failed: the HTTP status and body, or the connection error
    ttft: float = 0.0
    e2e: float = 0.0
    output_tokens: int = 0
    gaps: list[float] = field(default_factory=list)
    text: str = ""

    @property
    def tpot(self) -> float | None:
        if self.output_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)


async def stream_openai(
    session: aiohttp.ClientSession, server: Server, route: str, body: dict[str, Any]
) -> Sample:
    """POST an OpenAI streaming request; tokens from the closing usage, else one per chunk.
    Greedy unless ``body`` says its own temperature."""
    sample = Sample()
    body = {"temperature": 0, **body, "model": server.model, "stream": True}
    body["stream_options"] = {"include_usage": True}
    sent = time.perf_counter()
    try:
        async with session.post(f"{server.url}{route}", json=body) as resp:
            if resp.status != 200:
                sample.error = f"{resp.status} {(await resp.text())[:200]}"
                return sample
            chunks, usage = await _read_stream(resp, sample, sent)
    except aiohttp.ClientError as exc:
        sample.error = repr(exc)
        return sample
    sample.e2e = time.perf_counter() - sent
    sample.output_tokens = int(usage["completion_tokens"]) if usage else chunks
    sample.ok = chunks > 0
    return sample


async def _read_stream(
    resp: aiohttp.ClientResponse, sample: Sample, sent: float
) -> tuple[int, dict[str, Any] | None]:
    """Read the SSE stream into ``sample``: (text chunks, the closing usage if any)."""
    chunks, usage, last = 0, None, sent
    async for line in resp.content:
        if not line.startswith(b"data:") or line.strip() == b"data: [DONE]":
            continue
        event = json.loads(line[5:])
        usage = event.get("usage") or usage
        text = "".join(_chunk_text(c) for c in event.get("choices") or [])
        if not text:
            continue
        now = time.perf_counter()
        if chunks == 0:
            sample.ttft = now - sent
        else:
            sample.gaps.append(now - last)
        last, chunks = now, chunks + 1
        sample.text += text
    return chunks, usage


def _chunk_text(choice: dict[str, Any]) -> str:
    return str(choice.get("text") or (choice.get("delta") or {}).get("content") or "")


# --- workloads ------------------------------------------------------------------------------

Run = Callable[[aiohttp.ClientSession, Server], Awaitable[list[Sample]]]


def closed_loop(concurrency: int, per_client: int, max_tokens: int) -> Run:
    async def run(session: aiohttp.ClientSession, server: Server) -> list[Sample]:
        async def client(c: int) -> list[Sample]:
            out = []
            for i in range(per_client):
                topic = TOPICS[(c * per_client + i) % len(TOPICS)]
                prompt = f"Write a short story about {topic}. Once upon a time,"
                body = {"prompt": prompt, "max_tokens": max_tokens}
                out.append(await stream_openai(session, server, "/v1/completions", body))
            return out

        return _flat(await asyncio.gather(*(client(c) for c in range(concurrency))))

    return run


def poisson(rate: float, requests: int, max_tokens: int, seed: int) -> Run:
    async def run(session: aiohttp.ClientSession, server: Server) -> list[Sample]:
        rng = random.Random(seed)  # the same arrivals for both servers
        tasks = []
        for i in range(requests):
            prompt = f"Write a short story about {TOPICS[i % len(TOPICS)]}. Once upon a time,"
            body = {"prompt": prompt, "max_tokens": max_tokens}
            tasks.append(
                asyncio.create_task(stream_openai(session, server, "/v1/completions", body))
            )
            await asyncio.sleep(rng.expovariate(rate))
        return list(await asyncio.gather(*tasks))

    return run


def shared_prefix(concurrency: int, per_client: int, max_tokens: int) -> Run:
    async def run(session: aiohttp.ClientSession, server: Server) -> list[Sample]:
        async def client(c: int) -> list[Sample]:
            out = []
            for i in range(per_client):
                question = QUESTIONS[(c + i) % len(QUESTIONS)]
                body = {
                    "prompt": f"{SYSTEM}\nQuestion: {question}\nAnswer:",
                    "max_tokens": max_tokens,
                }
                out.append(await stream_openai(session, server, "/v1/completions", body))
            return out

        return _flat(await asyncio.gather(*(client(c) for c in range(concurrency))))

    return run


def multi_turn(concurrency: int, turns: int, max_tokens: int) -> Run:
    async def run(session: aiohttp.ClientSession, server: Server) -> list[Sample]:
        async def conversation(c: int) -> list[Sample]:
            messages = [{"role": "system", "content": SYSTEM}]
            out = []
            for t in range(turns):
                messages.append({"role": "user", "content": QUESTIONS[(c + t) % len(QUESTIONS)]})
                body = {"messages": messages, "max_tokens": max_tokens}
                sample = await stream_openai(session, server, "/v1/chat/completions", body)
                messages.append({"role": "assistant", "content": sample.text})
                out.append(sample)
            return out

        return _flat(await asyncio.gather(*(conversation(c) for c in range(concurrency))))

    return run


def _flat(lists: list[list[Sample]]) -> list[Sample]:
    return [s for part in lists for s in part]


# --- figures --------------------------------------------------------------------------------


def figures(samples: list[Sample], seconds: float, args: argparse.Namespace) -> dict[str, float]:
    done = [s for s in samples if s.ok]
    ttft = [s.ttft * 1e3 for s in done]
    tpot = [t * 1e3 for s in done if (t := s.tpot) is not None]
    itl = [g * 1e3 for s in done for g in s.gaps]
    e2e = [s.e2e * 1e3 for s in done]
    good = [
        s for s in done
        if s.ttft * 1e3 <= args.slo_ttft_ms and (s.tpot or 0) * 1e3 <= args.slo_tpot_ms
    ]  # fmt: skip
    for error in sorted({s.error for s in samples if s.error})[:3]:
        print(f"\n  failed: {error}")
    row = {
        "failed": len(samples) - len(done),
        "req_s": len(done) / seconds,
        "out_tok_s": sum(s.output_tokens for s in done) / seconds,
        "goodput_req_s": len(good) / seconds,
    }
    for name, values in (("ttft", ttft), ("tpot", tpot), ("itl", itl), ("e2e", e2e)):
        for q in (50, 90, 99):
            row[f"{name}_p{q}_ms"] = percentile(values, q / 100)
    return {k: round(v, 2) for k, v in row.items()}


SHOWN = ("out_tok_s", "req_s", "goodput_req_s", "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms",
         "tpot_p50_ms", "e2e_p50_ms", "failed")  # fmt: skip


def report(
    point: str,
    rounds: list[dict[str, dict[str, float]]],
    names: tuple[str, str] = ("llama-server", "tinyserve"),
) -> None:
    """Medians per server and the ratio of the second to the first (TinyServe / llama-server):
    median [min-max] over rounds."""
    base, other = names
    print(f"\n== {point}: {len(rounds)} rounds")
    print(f"{'':>14}" + "".join(f"{k:>18}" for k in SHOWN))
    for name in names:
        medians = [statistics.median(r[name][k] for r in rounds) for k in SHOWN]
        print(f"{name:>14}" + "".join(f"{m:>18.1f}" for m in medians))
    ratios = []
    for k in SHOWN:
        per_round = [r[other][k] / r[base][k] for r in rounds if r[base][k]]
        mid = statistics.median(per_round) if per_round else 0.0
        ratios.append(
            f"{mid:.2f} [{min(per_round):.2f}-{max(per_round):.2f}]" if per_round else "-"
        )
    print(f"{'ratio':>14}" + "".join(f"{r:>18}" for r in ratios), flush=True)


def plot(rows: list[dict[str, Any]]) -> Path:
    """Throughput and latency against load for both servers (``common.save_plot``)."""

    def draw(axes: list[Any]) -> None:
        closed = ("closed", axes[0], axes[1])
        for workload, ax_tput, ax_lat in (closed, ("poisson", axes[2], None)):
            for name, style in (("llama-server", "o--"), ("tinyserve", "s-")):
                by_load: dict[float, list[dict[str, Any]]] = {}
                for r in rows:
                    if r["workload"] == workload and r["server"] == name:
                        by_load.setdefault(float(r["load"]), []).append(r)
                loads = sorted(by_load)
                if not loads:
                    continue
                ax_tput.plot(loads, _medians(by_load, "out_tok_s"), style, label=name)
                if ax_lat is not None:
                    itl, ttft = _medians(by_load, "itl_p50_ms"), _medians(by_load, "ttft_p50_ms")
                    ax_lat.plot(loads, itl, style, label=f"{name} ITL p50")
                    ax_lat.plot(loads, ttft, style, alpha=0.5, label=f"{name} TTFT p50")
        axes[0].set(title="closed loop", xlabel="concurrent clients", ylabel="output tok/s")
        axes[1].set(title="closed loop latency", xlabel="concurrent clients", ylabel="ms")
        axes[1].set_yscale("log")
        axes[2].set(title="Poisson arrivals", xlabel="request rate (req/s)", ylabel="output tok/s")
        for ax in (ax for ax in axes if ax.has_data()):
            ax.legend(fontsize=8)
            ax.grid(alpha=0.3)

    return save_plot("vs_llama_server", draw, panels=3, width=5.0)


def _medians(by_load: dict[float, list[dict[str, Any]]], key: str) -> list[float]:
    return [statistics.median(r[key] for r in by_load[x]) for x in sorted(by_load)]


# --- the run --------------------------------------------------------------------------------


def load_points(args: argparse.Namespace) -> list[tuple[str, float, Run]]:
    workloads = set(args.workloads.split(","))
    concurrency = [int(c) for c in args.concurrency.split(",")]
    top = max(concurrency)
    points: list[tuple[str, float, Run]] = []
    if "closed" in workloads:
        for c in concurrency:
            points.append(("closed", c, closed_loop(c, args.per_client, args.max_tokens)))
    if "poisson" in workloads:
        for rate in (float(r) for r in args.rates.split(",")):
            requests = max(int(rate * args.poisson_seconds), 4)
            points.append(("poisson", rate, poisson(rate, requests, args.max_tokens, seed=7)))
    if "prefix" in workloads:
        points.append(("prefix", top, shared_prefix(top, args.per_client, args.max_tokens)))
    if "chat" in workloads:
        points.append(("chat", top, multi_turn(top, args.turns, args.max_tokens)))
    return points


async def measure(server: Server, run: Run, args: argparse.Namespace) -> dict[str, float]:
    timeout = aiohttp.ClientTimeout(total=900)
    # A new connection per request, for both servers: llama-server closes a connection after
    # some streams without saying so, and a reused one then fails as the request is sent.
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        if not server.model:
            server.model = await model_id(session, server.url)
        started = time.perf_counter()
        samples = await run(session, server)
        return figures(samples, time.perf_counter() - started, args)


def alternate(servers: list[Server], args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every load point of ``args`` on both servers, ``args.rounds`` rounds, the order
    alternating; reports each point as it is done and returns one row per server and round."""
    rows: list[dict[str, Any]] = []
    points = load_points(args)
    for n, (workload, load, run) in enumerate(points, 1):
        rounds = []
        for r in range(args.rounds):
            order = servers if r % 2 == 0 else servers[::-1]
            got = {}
            for server in order:
                step = f"[{n}/{len(points)}] {workload} {load:g} round {r + 1}/{args.rounds}"
                print(f"{step}: {server.name}      ", end="\r", flush=True)
                got[server.name] = asyncio.run(measure(server, run, args))
                where = {"workload": workload, "load": load, "round": r + 1}
                rows.append({**where, "server": server.name, **got[server.name]})
            rounds.append(got)
        report(f"{workload} {load:g}", rounds, (servers[0].name, servers[1].name))
    return rows


def load_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of the load points and of the servers' shared settings."""
    parser.add_argument("--workloads", default="closed,poisson,prefix,chat")
    parser.add_argument("--concurrency", default="1,8,16")
    parser.add_argument("--rates", default="1,2,4", help="Poisson request rates (req/s)")
    parser.add_argument("--poisson-seconds", type=float, default=30.0)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--per-client", type=int, default=2, help="closed loop: requests each")
    parser.add_argument("--turns", type=int, default=4, help="chat: turns per conversation")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--ctx-per-slot", type=int, default=4096, help="KV cells of each slot")
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--frontends", type=int, default=2)
    parser.add_argument("--slo-ttft-ms", type=float, default=2000.0)
    parser.add_argument("--slo-tpot-ms", type=float, default=100.0)


def tinyserve_flag_argument(parser: argparse.ArgumentParser) -> None:
    """``--tinyserve-flag``: extra flags for the TinyServe node (``args.tinyserve_flag``)."""
    parser.add_argument(
        "--tinyserve-flag",
        action="append",
        default=[],
        metavar="FLAG",
        help="an extra flag for tinyserve serve, repeatable (--tinyserve-flag=--no-prefix-cache)",
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    load_arguments(parser)
    tinyserve_flag_argument(parser)
    parser.add_argument(
        "--llama-server-flag",
        action="append",
        default=[],
        metavar="FLAG",
        help="an extra flag for llama-server, repeatable (--llama-server-flag=-kvu: one KV "
        "cache shared by all slots; by default each slot has cells of its own, as TinyServe's)",
    )
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument(
        "--name",
        default="vs_llama_server",
        help="the CSV's name in bench/results/ (no plot "
        "unless it is the default: the plot draws the closed-loop sweep)",
    )
    args = parser.parse_args()

    from tinyserve.model import resolve_model_path

    model_path = resolve_model_path(str(args.model) if args.model else None)
    llama_server_binary()  # build first, so the servers' start is not timed against a compile
    servers = [start_llama_server(args, model_path), start_tinyserve(args, model_path)]
    print(
        f"model {model_path.name}; threads {args.threads}; {args.slots} slots of "
        f"{args.ctx_per_slot} KV cells each; "
        f"TinyServe frontends {args.frontends}; {args.rounds} rounds, order alternating"
    )
    try:
        rows = alternate(servers, args)
    finally:
        for server in servers:
            server.stop()
    print(f"\nwrote {write_csv(args.name, rows)}")
    if args.name == "vs_llama_server":
        print(f"wrote {plot(rows)}")


if __name__ == "__main__":
    main()
