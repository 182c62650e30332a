"""deploy/render_nginx.py and the nginx template: what the rendered config must say."""

from __future__ import annotations

import argparse
import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.integration.nginx import find_nginx

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "deploy" / "render_nginx.py"
EXAMPLES = {
    "tinyserve.example.conf": ["--node", "127.0.0.1:8001-8004"],
    "tinyserve.two-nodes.example.conf": [
        "--node", "10.0.0.11:8001-8004", "--node", "10.0.0.12:8001-8004",
    ],
}  # fmt: skip


def load_renderer() -> ModuleType:
    spec = importlib.util.spec_from_file_location("render_nginx", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def render(*args: str) -> str:
    run = subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, check=True
    )
    return run.stdout


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_examples_in_the_repo_are_current(name: str) -> None:
    assert (REPO / "deploy" / "nginx" / name).read_text() == render(*EXAMPLES[name])


def test_config_streams_retries_and_passes_trace_context() -> None:
    text = render("--node", "127.0.0.1:8001-8002", "--client-max-body-size", "2m")
    for line in (
        "proxy_buffering off;",
        "proxy_http_version 1.1;",
        'proxy_set_header Connection "";',
        "proxy_read_timeout 300s;",
        "proxy_next_upstream error timeout http_503 http_429 non_idempotent;",
        "proxy_next_upstream_tries 2;",
        "client_max_body_size 2m;",
        "proxy_set_header traceparent $http_traceparent;",
        "proxy_set_header tracestate $http_tracestate;",
        "server 127.0.0.1:8001 max_fails=0;",
        "server 127.0.0.1:8002 max_fails=0;",
    ):
        assert line in text, line
    assert "{{" not in text


def test_nodes_take_turns_in_the_upstream() -> None:
    text = render("--node", "a:1-2", "--node", "b:7,9", "--node", "c:5")
    servers = re.findall(r"^\s+server (\S+) max_fails=0;$", text, re.M)
    assert servers == ["a:1", "b:7", "c:5", "a:2", "b:9"]
    assert "proxy_next_upstream_tries 5;" in text


def test_node_syntax() -> None:
    renderer = load_renderer()
    assert renderer.parse_node("[::1]:8001-8002") == ["[::1]:8001", "[::1]:8002"]
    for bad in ("8001", "host:", "host:9-8", "host:x", "host:70000"):
        with pytest.raises(argparse.ArgumentTypeError):
            renderer.parse_node(bad)
    with pytest.raises(KeyError):
        renderer.fill("{{nope}}", {})


@pytest.mark.skipif(find_nginx() is None, reason="nginx not installed (make test installs it)")
def test_nginx_accepts_the_standalone_config(tmp_path: Path) -> None:
    render("--node", "127.0.0.1:8001", "--listen", "127.0.0.1:18080", "--standalone", str(tmp_path))
    nginx = find_nginx()
    assert nginx is not None
    conf = str(tmp_path / "nginx.conf")
    run = subprocess.run(
        [nginx, "-t", "-p", str(tmp_path), "-c", conf, "-e", str(tmp_path / "error.log")],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr
