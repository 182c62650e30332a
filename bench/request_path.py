"""Count what one streaming request passes through, before and after a change.

The frontend runs unchanged against the test harness's stand-in engine
(``tests/frontend/harness.py``: real sockets and board, scripted replies), or with
``--engine real`` against the engine's own loop (``EngineProcess.serve``) on the default model
in a thread of the same process. A profile hook (``sys.setprofile`` and
``threading.setprofile`` from the start, so the tokenizer's and the engine loop's threads
count) records, while that one request is served after one warm-up request: every call
between two of our modules, leaving out the link's background tasks (heartbeat, board watch)
and the engine's heartbeat thread; and every type of ours an instance of which was made.
Printed for each version, the frontend's side and (``--engine real``) the engine's: our
modules whose code ran, distinct caller -> callee module pairs, calls across modules, and the
request-scoped types, on the side of the thread that made them.

A type counts when its ``__init__``/``__post_init__`` ran (classes, dataclasses, pydantic
models built in Python), a NamedTuple's ``__new__`` ran, or a pydantic model of ours came back
from a call (the models pydantic-core builds from JSON and nests run no Python ``__init__``;
they are found by walking the returned model). Types made only in Cython
(``tinyserve_native``) are not seen. After the warm-up request, what is made once per process
has been made, so what is made now is made for the request (or for a tick that serves it).

The code before is a commit (``--base``, default the last commit) in a temporary git worktree,
imported as ``tinyserve`` through a tree of links (``parse_cost.package_tree``).

    .venv/bin/python bench/request_path.py [--base COMMIT] [--route generate|chat]
        [--engine fake|real] [--list]

``--route chat``: a streamed ``POST /v1/chat/completions`` of one user message (the chat
template, the OpenAI stream writer) instead of ``POST /generate``. With ``--engine real`` the
reply is the model's, so the call counts move a little from run to run with its tokens.
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

ENGINE = "engine."  # tinyserve.engine.*: the engine's side of the module counts
SIDES = {False: "frontend:", True: "engine:"}  # types: the thread that made them

WORKER = r"""
import asyncio, json, sys, tempfile, threading
from collections import Counter
from aiohttp.test_utils import TestClient, TestServer
from pydantic import BaseModel
from tests.frontend.harness import FakeEngine, wait_serving
from tinyserve.config import build_config
from tinyserve.frontend.http.app import build_app

OURS = ("tinyserve.", "tests.frontend.harness")
BACKGROUND = ("_watch", "_heartbeat", "_serve_one_engine", "_beat")
calls, types = Counter(), set()
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

def ours(cls):
    return isinstance(cls, type) and cls.__module__.startswith("tinyserve.")

def made(cls):
    # On the side of the thread that made it: the engine's loop or not.
    side = "engine" if threading.current_thread().name == "engine-loop" else "frontend"
    types.add(f"{side}:{cls.__module__}.{cls.__qualname__}")

def walk(value, seen):
    # The pydantic models of ours inside value (pydantic-core builds nested ones, and whole
    # ones from JSON, without running any Python __init__).
    if id(value) in seen:
        return
    seen.add(id(value))
    if isinstance(value, BaseModel):
        if ours(type(value)):
            made(type(value))
        for name in type(value).model_fields:
            walk(getattr(value, name), seen)
    elif isinstance(value, (list, tuple)):
        for item in value:
            walk(item, seen)
    elif isinstance(value, dict):
        for item in value.values():
            walk(item, seen)

def hook(frame, event, arg):
    if not recording or threading.current_thread().name == "heartbeat":
        return
    if event == "return":
        if isinstance(arg, BaseModel) and ours(type(arg)):
            walk(arg, set())
        return
    if event != "call":
        return
    name, local, cls = frame.f_code.co_name, frame.f_locals, None
    if name in ("__init__", "__post_init__") and "self" in local:
        cls = type(local["self"])  # a class of ours, a dataclass or a pydantic model
    elif name in ("__new__", "<lambda>"):
        cls = local.get("_cls")  # a NamedTuple (its __new__ is a lambda)
    if ours(cls) and not in_background(frame):
        made(cls)
    callee = module_of(frame)
    if not callee.startswith("tinyserve."):
        return
    caller = frame.f_back
    while caller is not None and not module_of(caller).startswith(OURS):
        caller = caller.f_back
    if caller is None or module_of(caller) == callee or in_background(frame):
        return
    calls[(module_of(caller), callee)] += 1

class RealEngine:
    # The engine process's loop on the default model, in a thread of this process.

    def __init__(self, config):
        from tinyserve.engine.proc import EngineProcess
        from tinyserve.rundir import prepare_runtime_dir
        prepare_runtime_dir(config.runtime_dir)
        self.process = EngineProcess(config)
        self.process.start()
        self.loop = threading.Thread(target=self.process.serve, name="engine-loop")

    def start(self):
        self.loop.start()
        return self

    async def stop(self):
        import signal
        self.process.request_stop(signal.SIGTERM, None)
        await asyncio.to_thread(self.loop.join, 30)
        self.process.close()

async def main():
    global recording
    route, engine_kind = sys.argv[1], sys.argv[2]
    # Every thread (the tokenizer's, the engine loop's) from the start; inert until recording.
    sys.setprofile(hook); threading.setprofile(hook)
    with tempfile.TemporaryDirectory() as tmp:
        settings = {"runtime_dir": tmp, "max_tokens_limit": 256}
        if engine_kind == "real":
            settings.update({"slots": 1, "ctx_per_slot": 512, "threads": 1})
        config = build_config(settings, environ={})
        engine = (RealEngine(config) if engine_kind == "real" else FakeEngine(config)).start()
        try:
            async with TestClient(TestServer(build_app(config))) as client:
                await wait_serving(client, timeout_s=60)
                path, body = ROUTES[route]
                if route == "chat":
                    served = await (await client.get("/v1/models")).json()
                    body = {**body, "model": served["data"][0]["id"]}
                await (await client.post(path, json=body)).read()  # warm-up
                recording = True
                reply = await client.post(path, json=body)
                await reply.read()
                recording = False
                assert reply.status == 200, reply.status
        finally:
            await engine.stop()
    print(json.dumps({
        "calls": {f"{a} -> {b}": n for (a, b), n in calls.items()},
        "types": sorted(types),
    }))

asyncio.run(main())
"""


def run(tree: Path, route: str, engine: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-c", WORKER, route, engine],
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


def side(result: dict[str, Any], engine: bool) -> dict[str, Any]:
    """The frontend's (and shared modules') figures, or the engine's, from the worker's calls
    (``"caller -> callee": count``) and types."""
    on_side = lambda name: name.split(".", 1)[1].startswith(ENGINE) == engine  # noqa: E731
    calls = result["calls"]
    pairs = sorted(p for p in calls if on_side(p.split(" -> ")[0]))
    modules = {m for p in calls for m in p.split(" -> ") if m.startswith("tinyserve.")}
    return {
        "modules": sorted(m for m in modules if on_side(m)),
        "pairs": pairs,
        "calls": sum(calls[p] for p in pairs),
        "types": [t.split(":")[1] for t in result["types"] if t.startswith(SIDES[engine])],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default="HEAD", help="the commit before (default: HEAD)")
    parser.add_argument("--route", choices=("generate", "chat"), default="generate")
    parser.add_argument(
        "--engine",
        choices=("fake", "real"),
        default="fake",
        help="the test harness's stand-in engine, or the engine's loop on the default model",
    )
    parser.add_argument("--list", action="store_true", help="list the working tree's types")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        old_src = Path(tmp) / "old-src"
        subprocess.run(
            ["git", "worktree", "add", "--detach", "-q", str(old_src), args.base],
            cwd=ROOT,
            check=True,
        )
        try:
            trees = [(old_src, Path(tmp) / "old"), (ROOT, Path(tmp) / "new")]
            old, new = (
                run(with_tests(package_tree(src, dst), src), args.route, args.engine)
                for src, dst in trees
            )
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(old_src)], cwd=ROOT)
    path = "POST /generate" if args.route == "generate" else "POST /v1/chat/completions"
    print(f"before: {args.base}, after: the working tree; one streaming {path}")
    print(f"{'':50s} {'before':>7s} {'after':>7s}")
    sides = [("frontend + shared", False)] + [("engine", True)] * (args.engine == "real")
    for name, engine in sides:
        before, after = side(old, engine), side(new, engine)
        for key, label in [
            ("modules", "modules whose code ran"),
            ("pairs", "distinct module -> module calls"),
            ("calls", "calls across modules"),
            ("types", "request-scoped types of ours"),
        ]:
            figures = [r[key] if key == "calls" else len(r[key]) for r in (before, after)]
            print(f"{name + ': ' + label:50s} {figures[0]:7d} {figures[1]:7d}")
        if args.list:
            print("\n".join(f"    {t}" for t in after["types"]))


if __name__ == "__main__":
    main()
