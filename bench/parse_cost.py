"""What parsing + validating a request body costs, before and after the models (issue 19).

The code before is the commit before ``frontend/models/`` was added (or ``--base``), checked
out in a temporary git worktree; the code after is this working tree. Each version runs in
its own interpreter on a package-shaped tree of links to its sources (as ``make lint`` builds
for mypy), so both import as ``tinyserve.frontend``. Versions alternate (old, new, old, new)
and the best figure of each is kept, since this VM's speed drifts within minutes. A case is
the whole way from bytes to the resolved request the pipeline runs: for chat, the messages as
the template takes them. Also printed: the time and RSS to import each version's parsers.

    .venv/bin/python bench/parse_cost.py [--base COMMIT] [--runs 3000]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

WORKER = r"""
import json, resource, sys, time

def rss():
    return int(open("/proc/self/statm").read().split()[1]) * resource.getpagesize()

before, started = rss(), time.perf_counter()
from tinyserve.config import build_config
C = build_config({"max_tokens_limit": 512}, environ={})
if VERSION == "old":
    from tinyserve.frontend.validation import parse_generate
    from tinyserve.frontend.openai_schema import parse_chat, parse_completion
    PARSE = {
        "generate": lambda b: parse_generate(b, C),
        "completion": lambda b: parse_completion(b, C),
        "chat": lambda b: parse_chat(b, C),
    }
else:
    from tinyserve.frontend.models.chat import ChatCompletionRequest
    from tinyserve.frontend.models.parse import parse_body
    from tinyserve.frontend.native.native_bodies import GenerateRequest
    from tinyserve.frontend.openai.openai_requests import CompletionRequest

    def chat(b):
        req = parse_body(b, ChatCompletionRequest)
        return req.generation(C), req.template_messages()

    PARSE = {
        "generate": lambda b: parse_body(b, GenerateRequest).generation(C),
        "completion": lambda b: parse_body(b, CompletionRequest).generation(C),
        "chat": chat,
    }
imported_s, imported_mib = time.perf_counter() - started, (rss() - before) / 2**20

def cost_us(parse, body, runs):
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(runs):
            try:
                parse(body)
            except Exception:  # the 400 case: raising is its cost
                pass
        best = min(best, (time.perf_counter() - started) / runs * 1e6)
    return best

costs = {}
for name, (route, body, scale) in json.loads(sys.stdin.read()).items():
    costs[name] = cost_us(PARSE[route], body.encode(), max(RUNS // scale, 10))
print(json.dumps({"import_ms": imported_s * 1000, "import_mib": imported_mib, "costs": costs}))
"""


def cases() -> dict[str, tuple[str, str, int]]:
    """name -> (parser, body, how many times fewer runs)."""
    system = {"role": "system", "content": "You are a helpful assistant. Answer briefly."}
    user = {"role": "user", "content": "What is the capital of Germany, and why is it there?"}
    sampling = {"max_tokens": 64, "temperature": 0.7, "top_p": 0.9, "seed": 7, "stop": ["\n\n"]}
    turn = "lorem ipsum dolor sit amet " * 18  # ~490 characters
    roles = ("user", "assistant")
    long_chat = [{"role": roles[i % 2], "content": f"{i} {turn}"} for i in range(200)]
    bodies = {
        "generate, typical": ("generate", {"prompt": "Once upon a time", **sampling}, 1),
        "completion, typical": ("completion", {"model": "m", "prompt": "1, 2, 3,", **sampling}, 1),
        "chat, typical": (
            "chat", {"model": "m", "messages": [system, user], "stream": True, **sampling}, 1
        ),
        "chat, large (200 messages)": ("chat", {"model": "m", "messages": long_chat}, 50),
        "chat, refused (n: 2)": ("chat", {"model": "m", "messages": [user], "n": 2}, 1),
    }  # fmt: skip
    return {name: (route, json.dumps(body), scale) for name, (route, body, scale) in bodies.items()}


def package_tree(source: Path, into: Path) -> Path:
    """A folder where ``tinyserve.frontend`` imports from ``source``'s folders."""
    package = into / "tinyserve"
    package.mkdir(parents=True)
    for module in (source / "tinyserve").glob("*.py"):
        (package / module.name).symlink_to(module)
    (package / "frontend").symlink_to(source / "frontend")
    return into


def run(version: str, tree: Path, runs: int) -> dict[str, object]:
    code = f"VERSION = {version!r}\nRUNS = {runs}\n" + WORKER
    out = subprocess.run(
        [sys.executable, "-c", code],
        input=json.dumps(cases()),
        capture_output=True,
        text=True,
        cwd=tree,
        env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"},
        check=True,
    )
    result: dict[str, object] = json.loads(out.stdout)
    return result


def base_commit() -> str:
    added = subprocess.run(
        ["git", "log", "--diff-filter=A", "--format=%H", "--", "frontend/models/__init__.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return added[-1] + "^"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", help="the commit before (default: before frontend/models/)")
    parser.add_argument("--runs", type=int, default=3000)
    args = parser.parse_args()
    base = args.base or base_commit()
    with tempfile.TemporaryDirectory() as tmp:
        old_src = Path(tmp) / "old-src"
        subprocess.run(
            ["git", "worktree", "add", "--detach", "-q", str(old_src), base], cwd=ROOT, check=True
        )
        try:
            trees = {
                "old": package_tree(old_src, Path(tmp) / "old"),
                "new": package_tree(ROOT, Path(tmp) / "new"),
            }
            results = [(v, run(v, trees[v], args.runs)) for _ in range(2) for v in ("old", "new")]
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(old_src)], cwd=ROOT)
    report(base, results)


def report(base: str, results: list[tuple[str, dict[str, object]]]) -> None:
    best: dict[str, dict[str, float]] = {"old": {}, "new": {}}
    for version, result in results:
        figures = {**result["costs"], "import (ms)": result["import_ms"]}  # type: ignore[dict-item]
        figures["import RSS (MiB)"] = result["import_mib"]  # type: ignore[assignment]
        for name, value in figures.items():
            best[version][name] = min(best[version].get(name, float("inf")), value)
    print(f"old: {base}, new: the working tree; best of 2 interleaved runs each")
    print(f"{'':30s} {'old':>10s} {'new':>10s} {'new/old':>8s}")
    for name in best["old"]:
        old, new = best["old"][name], best["new"][name]
        unit = "" if "(" in name else " us"
        print(f"{name + unit:30s} {old:10.1f} {new:10.1f} {new / old:8.2f}")


if __name__ == "__main__":
    main()
