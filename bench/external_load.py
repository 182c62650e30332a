"""TinyServe and llama-server measured by a load tool we did not write: NVIDIA's AIPerf.

A cross-check of ``bench/vs_llama_server.py`` (issue 13, part 2): the same two servers,
started by that script's own functions with matching settings, driven by AIPerf's
``aiperf profile`` (streaming ``/v1/completions`` by default, a fixed concurrency, synthetic
prompts of a fixed token count and a fixed output length with ``ignore_eos``), alternately
(A then B, then B then A) for ``--rounds`` rounds. Figures are AIPerf's own, read from the
``profile_export_aiperf.json`` it writes: output-token and request throughput; TTFT; its
``inter_token_latency`` ((end-to-end - TTFT) / (tokens - 1) per request, which vLLM calls
TPOT); its ``inter_chunk_latency`` (the gaps between streamed chunks, vLLM's ITL); p50/p90/p99.
Printed per server (median over rounds) with the ratio TinyServe / llama-server (median
[range] over rounds); CSV in ``bench/results/external_load.csv``, one row per server and round.

AIPerf lives in its own venv, ``build/loadtool-venv`` (its pins must not touch .venv), made
here on first use with the versions in ``TOOL``; it counts tokens with a tokenizer directory
that ``bench/gguf_tokenizer.py`` makes once from the GGUF (``build/loadtool-tokenizers/``),
checked here against the node's ``POST /tokenize`` before the run. Given that directory's
absolute path, AIPerf loads it and asks no hub for anything.

    .venv/bin/python bench/external_load.py                       # 2 rounds, ~6 min
    .venv/bin/python bench/external_load.py --rounds 4 --requests 48 --osl 96
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from common import ROOT, get_json, post_json, progress, write_csv
from vs_llama_server import Server, llama_server_binary, start_llama_server, start_tinyserve

VENV = ROOT / "build" / "loadtool-venv"
TOKENIZERS = ROOT / "build" / "loadtool-tokenizers"
WORK = ROOT / "build" / "external-load"
# Pinned: the report fields read below and the tokenizer builder were checked against these.
TOOL = ["aiperf==0.13.0", "gguf==0.19.0", "transformers==5.24.0"]
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}

# Our column -> (AIPerf metric, statistic).
FIGURES: dict[str, tuple[str, str]] = {
    "out_tok_s": ("output_token_throughput", "avg"),
    "req_s": ("request_throughput", "avg"),
    **{f"ttft_p{q}_ms": ("time_to_first_token", f"p{q}") for q in (50, 90, 99)},
    **{f"tpot_p{q}_ms": ("inter_token_latency", f"p{q}") for q in (50, 90, 99)},
    **{f"itl_p{q}_ms": ("inter_chunk_latency", f"p{q}") for q in (50, 90, 99)},
    "e2e_p50_ms": ("request_latency", "p50"),
    "isl_mean": ("input_sequence_length", "avg"),
    "osl_mean": ("output_sequence_length", "avg"),
    "done": ("request_count", "avg"),
}

# Prompts for the tokenizer check: digits, punctuation, non-ASCII, whitespace, chat markup.
PROBES = [
    "Once upon a time, in a lighthouse by the sea,",
    "In 2024, 12345 apples cost $3.50 (or 3,50 EUR)!",
    "Ünïcödé — naïve café, 東京, 🙂",
    "  leading spaces\n\nand\ttabs   ",
    "<|im_start|>user\nHello<|im_end|>\n",
    "To be, or not to be: that is the question. Whether 'tis nobler in the mind to suffer",
]


# --- the tool and its tokenizer ---------------------------------------------------------------


def ensure_tool() -> Path:
    """``aiperf`` in its own venv under build/, installed on first use."""
    aiperf = VENV / "bin" / "aiperf"
    if aiperf.exists():
        return aiperf
    progress(f"installing {' '.join(TOOL)} into {VENV.relative_to(ROOT)} (a few minutes)")
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", str(VENV)], check=True)
    pip = [str(VENV / "bin" / "python"), "-m", "pip", "install", "--quiet"]
    subprocess.run([*pip, *TOOL], check=True)
    return aiperf


def ensure_tokenizer(model_path: Path) -> Path:
    """A tokenizer directory for ``model_path``, made once by bench/gguf_tokenizer.py."""
    out = TOKENIZERS / model_path.stem
    if not (out / "tokenizer.json").exists():
        progress(f"making a tokenizer from {model_path.name}")
        script = ROOT / "bench" / "gguf_tokenizer.py"
        run = [str(VENV / "bin" / "python"), str(script), str(model_path), str(out)]
        subprocess.run(run, check=True, env={**os.environ, **OFFLINE})
    return out


def check_tokenizer(tokenizer: Path, url: str) -> None:
    """The tool's token counts against the server's ``POST /tokenize``, on ``PROBES``."""
    count = (
        "import json, sys; from transformers import AutoTokenizer;"
        "t = AutoTokenizer.from_pretrained(sys.argv[1]);"
        "print(json.dumps([len(t.encode(p)) for p in json.load(sys.stdin)]))"
    )
    done = subprocess.run(
        [str(VENV / "bin" / "python"), "-c", count, str(tokenizer)],
        input=json.dumps(PROBES),
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, **OFFLINE},
    )
    ours = json.loads(done.stdout.strip().splitlines()[-1])
    theirs = [post_json(f"{url}/tokenize", {"prompt": p})[1]["count"] for p in PROBES]
    agree = sum(a == b for a, b in zip(ours, theirs, strict=True))
    print(f"tokenizer check: {agree}/{len(PROBES)} prompts counted alike: tool {ours}")
    print(f"{'':>17}node's POST /tokenize {theirs}")
    if agree != len(PROBES):
        raise SystemExit(f"the tokenizer in {tokenizer} does not count as the server does")


# --- one run of the tool ----------------------------------------------------------------------


def tool_argv(args: argparse.Namespace, server: Server, tokenizer: Path, out: Path) -> list[str]:
    """``aiperf profile`` for one server: the same seed, so both get the same prompts."""
    return [
        str(VENV / "bin" / "aiperf"), "profile", "--model", server.model, "--url", server.url,
        "--endpoint-type", args.endpoint, "--streaming", "--tokenizer", str(tokenizer),
        "--concurrency", str(args.concurrency), "--request-count", str(args.requests),
        "--warmup-request-count", str(args.concurrency),
        "--prompt-input-tokens-mean", str(args.isl), "--prompt-input-tokens-stddev", "0",
        "--prompt-output-tokens-mean", str(args.osl), "--prompt-output-tokens-stddev", "0",
        # Both servers take max_tokens; ignore_eos holds every output to exactly --osl tokens,
        # counted from each server's usage (re-tokenizing the streamed text can merge tokens:
        # 15.88 for 16 in a trial run). Prompt lengths are the tool's own count.
        "--use-legacy-max-tokens", "--extra-inputs", "ignore_eos:true", "--use-server-token-count",
        "--random-seed", "7", "--request-timeout-seconds", "600", "--ui", "none",
        "--export-level", "summary", "--no-server-metrics", "--no-gpu-telemetry",
        "--artifact-dir", str(out), *args.tool_flag,
    ]  # fmt: skip


def run_tool(argv: list[str], out: Path) -> dict[str, Any]:
    """Run the tool (its console output to ``out``/console.log) and return its JSON report."""
    out.mkdir(parents=True, exist_ok=True)
    log = out / "console.log"
    with log.open("w") as sink:
        # NOTE: not with OFFLINE: aiperf 0.13 then looks every --tokenizer up as a hub name in
        # the local cache, a directory included, and fails; given an absolute path it loads the
        # directory directly and asks the hub nothing.
        env = {k: v for k, v in os.environ.items() if k not in OFFLINE}
        done = subprocess.run(argv, stdout=sink, stderr=subprocess.STDOUT, env=env, timeout=900)
    report = out / "profile_export_aiperf.json"
    if done.returncode != 0 or not report.exists():
        raise SystemExit(f"aiperf failed (exit {done.returncode}); see {log}")
    return dict(json.loads(report.read_text()))


def figures(report: dict[str, Any]) -> dict[str, float]:
    """Our columns from the tool's report; NaN where it has no such figure."""
    row = {}
    for column, (metric, stat) in FIGURES.items():
        value = (report.get(metric) or {}).get(stat)
        row[column] = round(float(value), 2) if value is not None else math.nan
    row["errors"] = float(sum(int(e.get("count", 1)) for e in report.get("error_summary") or []))
    return row


# --- the side-by-side -------------------------------------------------------------------------


def show(rounds: list[dict[str, dict[str, float]]]) -> None:
    """One line per figure: each server's median over rounds, and the ratio's median [range]."""
    print(f"\n{'':>20}{'llama-server':>14}{'tinyserve':>14}   TinyServe / llama-server")
    for column in rounds[0]["tinyserve"]:
        medians = [
            statistics.median(r[name][column] for r in rounds)
            for name in ("llama-server", "tinyserve")
        ]
        per_round = [
            r["tinyserve"][column] / r["llama-server"][column]
            for r in rounds
            if r["llama-server"][column] and not math.isnan(r["llama-server"][column])
        ]
        spread = (
            f"{statistics.median(per_round):.2f} [{min(per_round):.2f}-{max(per_round):.2f}]"
            if per_round
            else "-"
        )
        print(f"{column:>20}{medians[0]:>14.1f}{medians[1]:>14.1f}   {spread}")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--endpoint", default="completions", choices=["completions", "chat"])
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--requests", type=int, default=24, help="per run, after the warmup")
    parser.add_argument("--isl", type=int, default=128, help="prompt tokens per request")
    parser.add_argument("--osl", type=int, default=64, help="output tokens per request")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="llama.cpp threads, both servers")
    parser.add_argument("--ctx-per-slot", type=int, default=4096, help="KV cells of each slot")
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--frontends", type=int, default=2)
    parser.add_argument("--model", type=Path, default=None)
    for flag, what in (("tinyserve", "tinyserve serve"), ("llama-server", "llama-server")):
        parser.add_argument(
            f"--{flag}-flag", action="append", default=[], metavar="FLAG",
            help=f"an extra flag for {what}, repeatable (--{flag}-flag=--x)",
        )  # fmt: skip
    parser.add_argument(
        "--tool-flag", action="append", default=[], metavar="FLAG",
        help="an extra flag for aiperf profile, repeatable (--tool-flag=--workers-max=2)",
    )  # fmt: skip
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    from tinyserve.model import resolve_model_path

    model_path = resolve_model_path(str(args.model) if args.model else None)
    ensure_tool()
    tokenizer = ensure_tokenizer(model_path)
    llama_server_binary()  # build first (once), so no run overlaps a compile
    servers = [start_llama_server(args, model_path), start_tinyserve(args, model_path)]
    rows: list[dict[str, Any]] = []
    rounds: list[dict[str, dict[str, float]]] = []
    try:
        for server in servers:
            server.model = str(get_json(f"{server.url}/v1/models")["data"][0]["id"])
        check_tokenizer(tokenizer, servers[1].url)
        print(
            f"model {model_path.name}; threads {args.threads}; {args.slots} slots of "
            f"{args.ctx_per_slot} KV cells; aiperf {args.endpoint}, c={args.concurrency}, "
            f"{args.requests} requests of {args.isl} -> {args.osl} tokens; {args.rounds} "
            "rounds, alternating"
        )
        for r in range(args.rounds):
            got = {}
            for server in servers if r % 2 == 0 else servers[::-1]:
                progress(f"round {r + 1}/{args.rounds}: aiperf against {server.name}")
                out = WORK / f"{server.name}-round{r + 1}"
                report = run_tool(tool_argv(args, server, tokenizer, out), out)
                got[server.name] = figures(report)
                rows.append({"round": r + 1, "server": server.name, **got[server.name]})
            rounds.append(got)
    finally:
        for server in servers:
            server.stop()
    show(rounds)
    print(f"\nwrote {write_csv('external_load', rows)}; the tool's reports under {WORK}")


if __name__ == "__main__":
    main()
