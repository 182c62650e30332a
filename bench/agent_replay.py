"""One coding agent's session, turn by turn, against TinyServe and llama-server: how much of
each turn's prompt each server reads from its prefix cache, and how long the turn waits.

The session is shaped as Claude Code's requests are (tests/agents: captured from Claude Code
2.1.197): a first system block ``x-anthropic-billing-header: ...; cch=XXXXX;`` whose ``cch``
is new on every request (as it is against Anthropic's own endpoints; ``--same-header`` keeps
it), the agent's system prompt and tools, a system message after the first user turn,
``thinking``, ``context_management`` and ``output_config.effort``; each later turn appends the
assistant's tool call and a tool result of ``--result-words`` words. Or ``--capture FILE``
replays the ``/v1/messages`` bodies of a capture (one JSON object a line with ``path`` and
``body``), with the same ``cch`` rewriting.

Both servers get one slot of ``--ctx-per-slot`` cells; llama-server its defaults otherwise
(``--jinja`` for its Anthropic endpoint). Each turn streams; the figures are the servers' own
usage (``cache_read_input_tokens``), the time to the first token and to the end.

    .venv/bin/python bench/agent_replay.py --turns 4
    .venv/bin/python bench/agent_replay.py --capture /tmp/claude-read.jsonl --ctx-per-slot 8192
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import time
from pathlib import Path
from typing import Any

import aiohttp
from vs_llama_server import Server, launch_llama_server, model_id, start_tinyserve

from tests.integration.node import free_port
from tinyserve.engine.weights import repack_weights
from tinyserve.model import resolve_model_path

BILLING = "x-anthropic-billing-header: cc_version=2.1.197.c23; cc_entrypoint=sdk-cli; cch={};"
CCH = re.compile(r"cch=[0-9a-f]{5};")
WORDS = [
    "file",
    "function",
    "returns",
    "value",
    "module",
    "test",
    "class",
    "import",
    "line",
    "error",
    "config",
    "server",
]


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def generated_session(args: argparse.Namespace) -> list[dict[str, Any]]:
    """``args.turns`` request bodies of one Claude Code-shaped session."""
    rng = random.Random(7)
    agent_prompt = _text(rng, args.prompt_words)
    tools = [
        {"name": name, "description": _text(rng, 60), "input_schema": {
            "$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object",
            "properties": {"path": {"type": "string", "format": "uri"},
                           "limit": {"type": "integer", "exclusiveMinimum": 0}},
            "required": ["path"], "additionalProperties": False}}
        for name in ("Read", "Grep", "Glob", "Bash", "Edit")
    ]  # fmt: skip
    turns: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "text", "text": "Explain this repository."}]},
        {"role": "system", "content": _text(rng, 300)},
    ]
    bodies = []
    for turn in range(args.turns):
        bodies.append({
            "model": "claude-opus-4-8", "max_tokens": 32000, "stream": True,
            "system": [{"type": "text", "text": BILLING.format("00000")},
                       {"type": "text", "text": agent_prompt}],
            "messages": list(turns), "tools": tools, "thinking": {"type": "adaptive"},
            "context_management": {"edits": [{"type": "clear_thinking_20251015"}]},
            "output_config": {"effort": "high"},
        })  # fmt: skip
        call = {"type": "tool_use", "id": f"toolu_{turn}", "name": "Read",
                "input": {"path": f"src/module{turn}.py"}}  # fmt: skip
        result = {"type": "tool_result", "tool_use_id": f"toolu_{turn}",
                  "content": _text(rng, args.result_words)}  # fmt: skip
        turns += [{"role": "assistant", "content": [call]}, {"role": "user", "content": [result]}]
    return bodies


def captured_session(path: Path) -> list[dict[str, Any]]:
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r["body"] for r in records if r.get("path", "").startswith("/v1/messages")
            and isinstance(r.get("body"), dict) and "messages" in r["body"]]  # fmt: skip


def stamped(
    body: dict[str, Any], model: str, turn: int, args: argparse.Namespace
) -> dict[str, Any]:
    """``body`` for ``model``, its output bounded, with a new ``cch`` unless ``--same-header``."""
    body = {**body, "model": model, "max_tokens": args.max_tokens, "stream": True}
    cch = "00000" if args.same_header else f"{random.Random(turn).getrandbits(20):05x}"
    system = body.get("system")
    if isinstance(system, list) and system and system[0].get("text", "").startswith("x-anthr"):
        text = system[0]["text"]
        text = CCH.sub(f"cch={cch};", text) if CCH.search(text) else f"{text} cch={cch};"
        body["system"] = [{**system[0], "text": text}, *system[1:]]
    return body


async def turn(
    session: aiohttp.ClientSession, server: Server, body: dict[str, Any]
) -> dict[str, Any]:
    started = time.monotonic()
    first = 0.0
    usage: dict[str, Any] = {}
    headers = {"x-api-key": "unused", "anthropic-version": "2023-06-01"}
    async with session.post(f"{server.url}/v1/messages", json=body, headers=headers) as resp:
        if resp.status != 200:
            return {"error": f"{resp.status} {(await resp.text())[:200]}"}
        async for raw in resp.content:
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue
            event = json.loads(line[5:])
            if event["type"] == "message_start":
                usage |= event["message"].get("usage", {})
            elif event["type"] == "content_block_delta" and not first:
                first = time.monotonic() - started
            elif event["type"] == "message_delta":
                usage |= {k: v for k, v in event.get("usage", {}).items() if v is not None}
    cached = int(usage.get("cache_read_input_tokens") or 0)
    prompt = int(usage.get("input_tokens") or 0) + cached
    return {"prompt": prompt, "cached": cached, "ttft": first,
            "seconds": time.monotonic() - started}  # fmt: skip


async def replay(
    server: Server, bodies: list[dict[str, Any]], args: argparse.Namespace
) -> list[dict[str, Any]]:
    timeout = aiohttp.ClientTimeout(total=None, sock_read=1800)
    # A connection per turn: llama-server closes one after a stream, which a pooled
    # connection's next request would find closed.
    connector = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        model = await model_id(session, server.url)
        return [
            await turn(session, server, stamped(b, model, i, args)) for i, b in enumerate(bodies)
        ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--capture", type=Path, help="replay these /v1/messages bodies")
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--prompt-words", type=int, default=1500)
    parser.add_argument("--result-words", type=int, default=250)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--same-header", action="store_true", help="keep cch= the same")
    parser.add_argument("--ctx-per-slot", type=int, default=8192)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--servers", default="tinyserve,llama-server")
    args = parser.parse_args()
    bodies = captured_session(args.capture) if args.capture else generated_session(args)
    model = resolve_model_path(None)
    starters = {
        "tinyserve": lambda: start_tinyserve(argparse.Namespace(
            threads=args.threads, ctx_per_slot=args.ctx_per_slot, slots=1, frontends=1,
            tinyserve_flag=[]), model),
        "llama-server": lambda: launch_llama_server(free_port(), [
            "-m", str(model), "-t", str(args.threads), "-tb", str(args.threads),
            "-c", str(args.ctx_per_slot), "-np", "1", "--jinja",
            *([] if repack_weights("auto") else ["--no-repack"])], "agent-replay.log"),
    }  # fmt: skip
    print(f"{len(bodies)} turns; cch {'kept' if args.same_header else 'new every request'}")
    print("server        turn  prompt  cached  cached%   ttft s  total s")
    for name in args.servers.split(","):
        server = starters[name]()
        try:
            rows = asyncio.run(replay(server, bodies, args))
        finally:
            server.stop()
        for i, row in enumerate(rows):
            if "error" in row:
                print(f"{name:12}  {i + 1:4}  {row['error']}")
                continue
            share = 100 * row["cached"] / max(row["prompt"], 1)
            print(f"{name:12}  {i + 1:4}  {row['prompt']:6}  {row['cached']:6}  {share:6.1f}%  "
                  f"{row['ttft'] or float('nan'):7.1f}  {row['seconds']:7.1f}")  # fmt: skip


if __name__ == "__main__":
    main()
