"""Concurrent coding-agent sessions that share a long prompt, against TinyServe and
llama-server (built from the same vendored llama.cpp), one after the other in one run.

Each session is shaped as Claude Code's requests are (captured from Claude Code 2.1.197,
tests/agents): streamed ``/v1/messages`` with a first system block
``x-anthropic-billing-header: ...; cch=XXXXX;`` whose ``cch`` is new on every request
(``--same-header`` keeps it), then the agent prompt and five tools shared by every session, the
session's own task, a system message after the first user turn, ``thinking``,
``context_management`` and ``output_config.effort``. Each turn appends the assistant's tool call
and a tool result of ``--result-tokens`` words; every ``--side-every`` turns the session also
sends a short side request (a title, as Claude Code asks its small model) beside its turn.
Session 0 starts first; session k starts when session k-1's first turn has ended, so every
session's first turn after the first could find the agent prompt cached.
``--capture FILE`` replays the ``/v1/messages`` bodies of a captured session instead (one JSON
object a line with ``path`` and ``body``), the same for every session.

Both servers get ``--slots`` slots of ``--ctx-per-slot`` cells; llama-server ``--jinja`` and its
defaults otherwise (its prompt cache in RAM included). Replies are greedy (``temperature`` 0).
Figures are the servers' own usage (``cache_read_input_tokens`` of the prompt's tokens, the
output tokens: compare ``out_per_turn`` before latencies, the two may not answer alike), the
time to the first streamed delta and to the end; for TinyServe the slowest turns' timelines
(``GET /v1/requests/{id}``) say where their time went.

    .venv/bin/python bench/agent_sessions.py                    # S=4, T=6, cch new every request
    .venv/bin/python bench/agent_sessions.py --same-header
    .venv/bin/python bench/agent_sessions.py --sessions 8
    .venv/bin/python bench/agent_sessions.py --sessions 1
    .venv/bin/python bench/agent_sessions.py --frontends 2
    .venv/bin/python bench/agent_sessions.py --capture claude-read.jsonl --sessions 1
    .venv/bin/python bench/agent_sessions.py --no-tools --ignore-eos  # the same work on both
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from common import percentile
from vs_llama_server import Server, launch_llama_server, model_id, start_tinyserve

from tests.integration.node import free_port
from tinyserve.engine.runtime.weights import repack_weights
from tinyserve.model import resolve_model_path

BILLING = "x-anthropic-billing-header: cc_version=2.1.197.c23; cc_entrypoint=sdk-cli; cch={};"
CCH = re.compile(r"cch=[0-9a-f]{5};")
HEADERS = {"x-api-key": "unused", "anthropic-version": "2023-06-01"}
WORDS = ["file", "function", "returns", "value", "module", "test", "class", "import",
         "line", "error", "config", "server", "the", "of", "and", "to", "in", "is", "that",
         "for"]  # fmt: skip
TOOL_WORDS = 60  # each of the five tools' descriptions
TOOLS_TOKENS = 700  # about what the five tools add to the prompt, rendered


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


# --- the workload -------------------------------------------------------------------------


@dataclass
class Session:
    """One agent session: its turns' bodies are built as it goes (a turn appends a call and a
    result to the conversation)."""

    index: int
    system: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    messages: list[dict[str, Any]]
    rng: random.Random
    captured: list[dict[str, Any]] = field(default_factory=list)

    def body(self, turn: int) -> dict[str, Any]:
        if self.captured:
            return self.captured[turn]
        return {
            "max_tokens": 32000, "system": self.system, "messages": list(self.messages),
            "tools": self.tools, "thinking": {"type": "adaptive"},
            "context_management": {"edits": [{"type": "clear_thinking_20251015"}]},
            "output_config": {"effort": "high"},
        }  # fmt: skip

    def advance(self, turn: int, result_words: int) -> None:
        """The assistant called ``Read``; the tool answered."""
        call_id = f"toolu_{self.index}_{turn}"
        call = {"type": "tool_use", "id": call_id, "name": "Read",
                "input": {"path": f"src/session{self.index}/module{turn}.py"}}  # fmt: skip
        result = {"type": "tool_result", "tool_use_id": call_id,
                  "content": _text(self.rng, result_words)}  # fmt: skip
        self.messages += [
            {"role": "assistant", "content": [call]},
            {"role": "user", "content": [result]},
        ]

    def side(self) -> dict[str, Any]:
        """A title for the conversation, as Claude Code asks its small model beside a turn."""
        task = self.messages[0]["content"][0]["text"] if not self.captured else "the task"
        return {
            "max_tokens": 32,
            "system": [{"type": "text", "text": "Write a title of at most five words for "
                        "the coding conversation the user describes. Answer with the title."}],
            "messages": [{"role": "user", "content": task}],
        }  # fmt: skip


def sessions(args: argparse.Namespace) -> list[Session]:
    rng = random.Random(7)
    agent_prompt = _text(rng, max(args.prompt_tokens - TOOLS_TOKENS, 100))
    tools = [
        {"name": name, "description": _text(rng, TOOL_WORDS), "input_schema": {
            "$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object",
            "properties": {"path": {"type": "string", "format": "uri"},
                           "limit": {"type": "integer", "exclusiveMinimum": 0}},
            "required": ["path"], "additionalProperties": False}}
        for name in ("Read", "Grep", "Glob", "Bash", "Edit")
    ]  # fmt: skip
    environment = _text(rng, 80)  # the system message after the first user turn
    captured = captured_session(args.capture) if args.capture else []
    made = []
    for k in range(args.sessions):
        task = f"Session {k}: find why test_module{k} fails and fix it. " + _text(rng, 20)
        messages = [
            {"role": "user", "content": [{"type": "text", "text": task}]},
            {"role": "system", "content": f"{environment} Working directory: /src/project{k}"},
        ]
        system = [{"type": "text", "text": BILLING.format("00000")},
                  {"type": "text", "text": agent_prompt}]  # fmt: skip
        made.append(Session(k, system, tools, messages, random.Random(100 + k), captured))
    return made


def captured_session(path: Path) -> list[dict[str, Any]]:
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r["body"] for r in records if r.get("path", "").startswith("/v1/messages")
            and isinstance(r.get("body"), dict) and "messages" in r["body"]]  # fmt: skip


def stamped(body: dict[str, Any], model: str, args: argparse.Namespace) -> dict[str, Any]:
    """``body`` for ``model``, greedy, its output bounded, with a new ``cch`` in its billing
    block unless ``--same-header``."""
    body = {**body, "model": model, "max_tokens": min(body["max_tokens"], args.max_tokens),
            "stream": True, "temperature": 0}  # fmt: skip
    if args.no_tools:
        body.pop("tools", None)
    if args.ignore_eos:
        body["ignore_eos"] = True  # TinyServe's extension; llama-server has it from its flag
    cch = "00000" if args.same_header else f"{random.getrandbits(20):05x}"
    system = body.get("system")
    if isinstance(system, list) and system and system[0].get("text", "").startswith("x-anthr"):
        text = system[0]["text"]
        text = CCH.sub(f"cch={cch};", text) if CCH.search(text) else f"{text} cch={cch};"
        body["system"] = [{**system[0], "text": text}, *system[1:]]
    return body


# --- one request ----------------------------------------------------------------------------


@dataclass
class Turn:
    session: int
    turn: int  # -1: a side request
    ok: bool = False
    error: str = ""
    prompt: int = 0  # prompt tokens, cached or not
    cached: int = 0
    output: int = 0
    ttft: float = 0.0
    seconds: float = 0.0
    request_id: str = ""


async def send(
    http: aiohttp.ClientSession, server: Server, body: dict[str, Any], done: Turn
) -> Turn:
    started = time.monotonic()
    usage: dict[str, Any] = {}
    try:
        async with http.post(f"{server.url}/v1/messages", json=body, headers=HEADERS) as resp:
            done.request_id = resp.headers.get("X-Request-Id", "")
            if resp.status != 200:
                done.error = f"{resp.status} {(await resp.text())[:200]}"
                return done
            async for raw in resp.content:
                line = raw.decode().strip()
                if not line.startswith("data:"):
                    continue
                event = json.loads(line[5:])
                if event["type"] == "message_start":
                    usage |= event["message"].get("usage", {})
                elif event["type"] == "content_block_delta" and not done.ttft:
                    done.ttft = time.monotonic() - started
                elif event["type"] == "message_delta":
                    usage |= {k: v for k, v in event.get("usage", {}).items() if v is not None}
    except aiohttp.ClientError as exc:
        done.error = f"{type(exc).__name__}: {exc}"
        return done
    done.seconds = time.monotonic() - started
    done.ttft = done.ttft or done.seconds  # a reply with no delta: its first token is its end
    done.cached = int(usage.get("cache_read_input_tokens") or 0)
    done.prompt = int(usage.get("input_tokens") or 0) + done.cached
    done.output = int(usage.get("output_tokens") or 0)
    done.ok = True
    return done


# --- one server ---------------------------------------------------------------------------


async def run_sessions(server: Server, args: argparse.Namespace) -> tuple[list[Turn], float]:
    timeout = aiohttp.ClientTimeout(total=None, sock_read=1800)
    # A connection per request: llama-server closes one after a stream, which a pooled
    # connection's next request would find closed.
    connector = aiohttp.TCPConnector(force_close=True, limit=0)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as http:
        model = await model_id(http, server.url)
        started = [asyncio.Event() for _ in range(args.sessions + 1)]
        started[0].set()
        turns: list[Turn] = []

        async def session(s: Session) -> None:
            await started[s.index].wait()
            count = len(s.captured) if s.captured else args.turns
            for t in range(count):
                body = stamped(s.body(t), model, args)
                work = [send(http, server, body, Turn(s.index, t))]
                if args.side_every and t % args.side_every == args.side_every - 1:
                    work.append(send(http, server, stamped(s.side(), model, args),
                                     Turn(s.index, -1)))  # fmt: skip
                turns.extend(await asyncio.gather(*work))
                if t == 0:
                    started[s.index + 1].set()
                s.advance(t, args.result_tokens)

        began = time.monotonic()
        await asyncio.gather(*(session(s) for s in sessions(args)))
        return turns, time.monotonic() - began


async def timelines(server: Server, turns: list[Turn]) -> dict[str, dict[str, Any]]:
    async with aiohttp.ClientSession() as http:
        found = {}
        for t in turns:
            async with http.get(f"{server.url}/v1/requests/{t.request_id}") as resp:
                if resp.status == 200:
                    found[t.request_id] = await resp.json()
        return found


def why(timeline: dict[str, Any]) -> str:
    """Where a TinyServe turn's time went, from its timeline."""
    queue = (timeline.get("queue") or {}).get("wait_ms") or 0.0
    restore = timeline.get("restore")
    prefill = timeline.get("prefill") or []
    decode = timeline.get("decode") or {}
    parts = [f"queued {queue:.0f} ms", f"reused {timeline.get('prefix_reused_tokens', 0)}"]
    if restore:
        parts.append(f"restored {restore['tokens']} from {restore['tier']} in "
                     f"{restore['ms']:.0f} ms")  # fmt: skip
    parts.append(f"prefilled {sum(c['tokens'] for c in prefill)} in {len(prefill)} chunks, "
                 f"{sum(c['ms'] for c in prefill):.0f} ms")  # fmt: skip
    parts.append(f"decoded {decode.get('ticks', 0)} ticks, {decode.get('ms', 0):.0f} ms")
    return "; ".join(parts)


# --- figures ------------------------------------------------------------------------------


def summary(name: str, turns: list[Turn], seconds: float) -> dict[str, float]:
    main = [t for t in turns if t.turn >= 0 and t.ok]
    side = [t for t in turns if t.turn < 0 and t.ok]
    later = [t for t in main if t.turn > 0]
    later_prompt = sum(t.prompt for t in later)
    firsts = sorted((t for t in main if t.turn == 0), key=lambda t: t.session)
    prompt = sum(t.prompt for t in main + side)
    cached = sum(t.cached for t in main + side)
    row = {
        "failed": sum(not t.ok for t in turns),
        "turn_p50_s": percentile([t.seconds for t in main], 0.5),
        "turn_p99_s": percentile([t.seconds for t in main], 0.99),
        "ttft_p50_s": percentile([t.ttft for t in main], 0.5),
        "ttft_p99_s": percentile([t.ttft for t in main], 0.99),
        "side_p50_s": percentile([t.seconds for t in side], 0.5) if side else 0.0,
        "prompt_tokens": prompt,
        "computed_tokens": prompt - cached,
        "cached_pct": 100 * cached / max(prompt, 1),
        "later_cached_pct": 100 * sum(t.cached for t in later) / max(later_prompt, 1),
        "out_per_turn": statistics.mean(t.output for t in main) if main else 0.0,
        "out_tok_s": sum(t.output for t in main + side) / seconds,
        "seconds": seconds,
    }  # fmt: skip
    print(f"\n== {name}: {len(main)} turns, {len(side)} side requests in {seconds:.1f} s")
    for error in sorted({t.error for t in turns if t.error})[:3]:
        print(f"  failed: {error}")
    print("  first turns, cached/prompt: " + ", ".join(
        f"s{t.session} {t.cached}/{t.prompt} ({100 * t.cached / max(t.prompt, 1):.0f}%)"
        for t in firsts))  # fmt: skip
    print("  " + "  ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}"
                           for k, v in row.items()))  # fmt: skip
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=4)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--prompt-tokens", type=int, default=4000, help="the agent prompt's")
    parser.add_argument("--result-tokens", type=int, default=300, help="each tool result's")
    parser.add_argument("--max-tokens", type=int, default=64, help="each reply's bound")
    parser.add_argument("--side-every", type=int, default=3, help="0: no side requests")
    parser.add_argument("--same-header", action="store_true", help="keep cch= the same")
    parser.add_argument("--no-tools", action="store_true",
                        help="leave the tool list out (llama-server leaves it out of this "
                        "model's prompt anyway): both servers then see alike prompts")  # fmt: skip
    parser.add_argument("--ignore-eos", action="store_true",
                        help="every reply runs to --max-tokens on both servers (llama-server "
                        "--ignore-eos; its Messages route passes no such field): equal work "
                        "whatever the model writes")  # fmt: skip
    parser.add_argument("--capture", type=Path, help="replay these /v1/messages bodies")
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--ctx-per-slot", type=int, default=8192)
    parser.add_argument("--frontends", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=1, help="each server this many times")
    parser.add_argument("--servers", default="tinyserve,llama-server")
    parser.add_argument("--tinyserve-flag", action="append", default=[], metavar="FLAG",
                        help="passed to TinyServe as is (repeatable)")  # fmt: skip
    parser.add_argument("--llama-server-flag", action="append", default=[], metavar="FLAG",
                        help="passed to llama-server as is (repeatable): -fa=off")  # fmt: skip
    args = parser.parse_args()
    model = resolve_model_path(None)
    starters = {
        "tinyserve": lambda: start_tinyserve(argparse.Namespace(
            threads=args.threads, ctx_per_slot=args.ctx_per_slot, slots=args.slots,
            frontends=args.frontends, tinyserve_flag=args.tinyserve_flag), model),
        "llama-server": lambda: launch_llama_server(free_port(), [
            "-m", str(model), "-t", str(args.threads), "-tb", str(args.threads),
            "-c", str(args.slots * args.ctx_per_slot), "-np", str(args.slots), "--jinja",
            *([] if repack_weights("auto") else ["--no-repack"]),
            *(["--ignore-eos"] if args.ignore_eos else []), *args.llama_server_flag],
            "agent-sessions.log"),
    }  # fmt: skip
    header = "the same" if args.same_header else "new every request"
    print(
        f"{args.sessions} sessions x {args.turns} turns; cch {header}; {args.slots} slots of "
        f"{args.ctx_per_slot} cells; {args.frontends} TinyServe frontend(s)"
        + "; no tools" * args.no_tools
        + "; every reply max_tokens long" * args.ignore_eos
    )
    rows: dict[str, list[dict[str, float]]] = {}
    for _ in range(args.rounds):
        for name in args.servers.split(","):
            server = starters[name]()
            try:
                turns, seconds = asyncio.run(run_sessions(server, args))
                found = asyncio.run(timelines(server, turns)) if name == "tinyserve" else {}
            finally:
                server.stop()
            rows.setdefault(name, []).append(summary(name, turns, seconds))
            slowest = sorted((t for t in turns if t.request_id in found),
                             key=lambda t: -t.seconds)[:4]  # fmt: skip
            for t in slowest:
                print(f"  slow: s{t.session} turn {t.turn} {t.seconds:.1f} s: "
                      f"{why(found[t.request_id])}")  # fmt: skip
    if len(rows) == 2 and "tinyserve" in rows:
        print("\n== tinyserve / llama-server, medians over rounds")
        for key in ("turn_p50_s", "turn_p99_s", "ttft_p50_s", "ttft_p99_s", "out_tok_s"):
            ts = statistics.median(r[key] for r in rows["tinyserve"])
            ls = statistics.median(r[key] for r in rows["llama-server"])
            print(f"  {key:12} {ts:8.2f} {ls:8.2f}  ratio {ts / ls if ls else float('nan'):.2f}")


if __name__ == "__main__":
    main()
