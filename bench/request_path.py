"""Count what one streaming request passes through in a frontend, before and after.

The frontend runs unchanged against the test harness's stand-in engine
(``tests/frontend/harness.py``: real sockets and board, scripted replies); a profile hook
(``sys.setprofile`` and ``threading.setprofile``, so the tokenizer's executor thread counts)
records every call between two of our modules while that one request is served, after one
warm-up request, leaving out the link's own background tasks (heartbeat, board watch). Printed
for each version: our modules whose code ran, distinct caller -> callee module pairs, calls
across modules, and the classes of ours whose ``__init__`` ran (request-scoped or not: the list
is printed so that a reader can judge). The code before is a commit (``--base``, default the
last commit) in a temporary git worktree, imported as ``tinyserve`` through a tree of links
(``parse_cost.package_tree``).

    .venv/bin/python bench/request_path.py [--base COMMIT] [--route generate|chat]

``--route chat``: a streamed ``POST /v1/chat/completions`` of one user message (the chat
template, the OpenAI stream writer) instead of ``POST /generate``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from parse_cost import ROOT, package_tree

WORKER = r"""
import asyncio, json, sys, tempfile, threading
from collections import Counter
from aiohttp.test_utils import TestClient, TestServer
from tests.frontend.harness import FakeEngine, wait_serving
from tinyserve.config import build_config
from tinyserve.frontend.http.app import build_app

OURS = ("tinyserve.", "tests.frontend.harness")
BACKGROUND = ("_watch", "_heartbeat", "_serve_one_engine", "_beat")
calls, inits = Counter(), set()
recording = False
ROUTES = {
    "generate": ("/generate", {"prompt": "Once upon a time", "max_tokens": 4, "stream": True}),
    "chat": ("/v1/chat/completions", {
        "model": "fake", "max_tokens": 4, "stream": True,
        "messages": [{"role": "user", "content": "Once upon a time"}]}),
}

def module_of(frame):
    return frame.f_globals.get("__name__", "")

def in_background(frame):
    while frame is not None:
        link = module_of(frame).startswith("tinyserve.frontend.link")
        if link and frame.f_code.co_name in BACKGROUND:
            return True
        frame = frame.f_back
    return False

def hook(frame, event, arg):
    if not recording or event != "call":
        return
    callee = module_of(frame)
    if not callee.startswith("tinyserve."):
        return
    if frame.f_code.co_name in ("__init__", "__post_init__") and "self" in frame.f_locals:
        inits.add(f"{callee}.{type(frame.f_locals['self']).__name__}")
    caller = frame.f_back
    while caller is not None and not module_of(caller).startswith(OURS):
        caller = caller.f_back
    if caller is None or module_of(caller) == callee or in_background(frame):
        return
    calls[(module_of(caller), callee)] += 1

async def main():
    global recording
    with tempfile.TemporaryDirectory() as tmp:
        config = build_config({"runtime_dir": tmp, "max_tokens_limit": 256}, environ={})
        engine = FakeEngine(config).start()
        try:
            async with TestClient(TestServer(build_app(config))) as client:
                await wait_serving(client)
                path, body = ROUTES[sys.argv[1]]
                await (await client.post(path, json=body)).read()  # warm-up
                sys.setprofile(hook); threading.setprofile(hook)
                recording = True
                await (await client.post(path, json=body)).read()
                recording = False
                sys.setprofile(None); threading.setprofile(None)
        finally:
            await engine.stop()
    modules = sorted({m for pair in calls for m in pair if m.startswith("tinyserve.")})
    print(json.dumps({
        "modules": modules,
        "pairs": sorted(f"{a} -> {b}" for a, b in calls),
        "calls": sum(calls.values()),
        "inits": sorted(inits),
    }))

asyncio.run(main())
"""


def run(tree: Path, route: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-c", WORKER, route],
        capture_output=True,
        text=True,
        cwd=tree,
        env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"},
    )
    if out.returncode:  # an older tree whose harness or protocol differs: say so, briefly
        raise SystemExit(f"the worker failed in {tree}:\n{out.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(out.stdout.splitlines()[-1])
    return result


def with_tests(tree: Path, source: Path) -> Path:
    """The package tree plus the source's ``tests`` package (the harness lives there)."""
    (tree / "tests").symlink_to(source / "tests")
    return tree


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default="HEAD", help="the commit before (default: HEAD)")
    parser.add_argument("--route", choices=("generate", "chat"), default="generate")
    parser.add_argument("--list", action="store_true", help="print the modules and classes")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        old_src = Path(tmp) / "old-src"
        subprocess.run(
            ["git", "worktree", "add", "--detach", "-q", str(old_src), args.base],
            cwd=ROOT,
            check=True,
        )
        try:
            old = run(with_tests(package_tree(old_src, Path(tmp) / "old"), old_src), args.route)
            new = run(with_tests(package_tree(ROOT, Path(tmp) / "new"), ROOT), args.route)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(old_src)], cwd=ROOT)
    path = "POST /generate" if args.route == "generate" else "POST /v1/chat/completions"
    print(f"before: {args.base}, after: the working tree; one streaming {path}")
    print(f"{'':44s} {'before':>7s} {'after':>7s}")
    for key, label in [
        ("modules", "frontend + shared modules whose code ran"),
        ("pairs", "distinct module -> module calls"),
        ("calls", "calls across modules"),
        ("inits", "classes of ours constructed"),
    ]:
        before, after = (r[key] if key == "calls" else len(r[key]) for r in (old, new))
        print(f"{label:44s} {before:7d} {after:7d}")
    if args.list:
        for key in ("modules", "inits"):
            gone = sorted(set(old[key]) - set(new[key]))
            added = sorted(set(new[key]) - set(old[key]))
            print(f"{key}: gone {gone}\n{key}: added {added}")


if __name__ == "__main__":
    main()
