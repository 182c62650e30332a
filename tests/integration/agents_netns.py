"""Runs command-line coding agents against a real node, inside a network namespace of its own.

``test_agents.py`` starts this module under ``unshare -n`` (as root): the namespace has only a
loopback interface, which this brings up, so the node it starts and the agents it runs can
reach each other and nothing else. It writes, as JSON, each run's exit code, output and time
and how the requests it made ended, and the node's HTTP responses by route and status (from
``/metrics``) and its log.

    unshare -n python -m tests.integration.agents_netns SPEC.json RESULT.json

SPEC: ``{"workdir": ..., "node_flags": [...], "runs": [{"name", "agent", "argv", "env",
"home_files", "timeout_s"}]}``; each agent gets a scratch HOME (with ``home_files`` written
into it) and a scratch repository (a README and ``hello.py``) as its working directory, the
same for all its runs: an agent's prompt names its directory, so its runs share a prefix.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from tests.integration.node import Node

HELLO = 'def greet(name):\n    return f"Hello, {name}!"\n\n\nprint(greet("world"))\n'
README = "# hello\n\nA one-file example project.\n"


def scratch_repo(where: Path) -> Path:
    where.mkdir(parents=True)
    (where / "README.md").write_text(README)
    (where / "hello.py").write_text(HELLO)
    subprocess.run(["git", "init", "-q"], cwd=where, check=True)
    return where


def run_agent(run: dict[str, Any], workdir: Path, node: Node) -> dict[str, Any]:
    """``run`` against ``node``, and the endings of the requests it made (the node's log)."""
    before = node.log_path.stat().st_size
    outcome = _run(run, workdir, node.url)
    with open(node.log_path, "rb") as log:
        log.seek(before)
        lines = log.read().decode(errors="replace").splitlines()
    ended = [
        line.split("finish_reason=")[1].split()[0] for line in lines if "finish_reason=" in line
    ]
    return {**outcome, "finish_reasons": ended}


def _run(run: dict[str, Any], workdir: Path, url: str) -> dict[str, Any]:
    home, repo = workdir / run["agent"] / "home", workdir / run["agent"] / "repo"
    if not home.exists():
        home.mkdir(parents=True)
        scratch_repo(repo)
    for name, text in run.get("home_files", {}).items():
        path = home / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text.replace("{url}", url))
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(home),
        "LANG": "C.UTF-8",
        **{k: v.replace("{url}", url) for k, v in run["env"].items()},
    }
    started = time.monotonic()
    try:
        done = subprocess.run(
            run["argv"], cwd=repo, env=env, capture_output=True, stdin=subprocess.DEVNULL,
            timeout=run["timeout_s"],
        )  # fmt: skip
        code, out, err = done.returncode, done.stdout, done.stderr
    except subprocess.TimeoutExpired as expired:
        code, out, err = None, expired.stdout or b"", expired.stderr or b""
    return {
        "name": run["name"],
        "returncode": code,
        "seconds": round(time.monotonic() - started, 1),
        "stdout": out.decode(errors="replace")[-4000:],
        "stderr": err.decode(errors="replace")[-4000:],
    }


def responses_by_route(url: str) -> dict[str, dict[str, float]]:
    """``tinyserve_http_responses_total`` as {route: {status: count}}."""
    text = urllib.request.urlopen(f"{url}/metrics", timeout=10).read().decode()
    counts: dict[str, dict[str, float]] = {}
    for line in text.splitlines():
        if line.startswith("tinyserve_http_responses_total{"):
            labels, value = line[len("tinyserve_http_responses_total{") :].split("} ")
            fields = dict(part.split("=", 1) for part in labels.split(","))
            route, status = fields["route"].strip('"'), fields["code"].strip('"')
            counts.setdefault(route, {})[status] = float(value)
    return counts


def main(spec_path: str, result_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    workdir = Path(spec["workdir"])
    node = Node(workdir, *spec["node_flags"]).start()
    try:
        runs = [run_agent(run, workdir, node) for run in spec["runs"]]
        responses = responses_by_route(node.url)
    finally:
        node.stop(check=False)
    result = {"runs": runs, "responses": responses, "log": node.log()[-200_000:]}
    Path(result_path).write_text(json.dumps(result))


if __name__ == "__main__":
    main(*sys.argv[1:3])
