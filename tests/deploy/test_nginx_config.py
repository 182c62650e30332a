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


AFFINITY_EXAMPLE = ["--node", "10.0.0.11:8001-8002", "--node", "10.0.0.12:8001-8002", "--affinity"]


def test_affinity_example_in_the_repo_is_current() -> None:
    example = REPO / "deploy" / "nginx" / "tinyserve.affinity.example.conf"
    assert example.read_text() == render(*AFFINITY_EXAMPLE)


def test_affinity_is_off_unless_asked() -> None:
    text = render("--node", "a:1-2", "--node", "b:1")
    assert "proxy_pass http://tinyserve;" in text
    for word in ("hash ", "map ", "tinyserve_affinity", "$tinyserve_upstream", "X-Session-Id"):
        assert word not in text, word


def test_affinity_hashes_the_session_header_with_the_round_robin_as_fallback() -> None:
    text = render("--node", "a:1-2", "--node", "b:7", "--affinity")
    assert "proxy_pass http://$tinyserve_upstream;" in text
    # No header, or an empty one: the round-robin upstream, as without --affinity.
    mapping = re.search(r"map \$http_x_session_id \$tinyserve_upstream \{(.*?)\}", text, re.S)
    assert mapping is not None, text
    assert mapping.group(1).split() == ['""', "tinyserve;", "default", "tinyserve_affinity;"]
    block = re.search(r"upstream tinyserve_affinity \{(.*?)\n\}", text, re.S)
    assert block is not None, text
    lines = [line.split("#")[0].strip() for line in block.group(1).splitlines()]
    directives = [line for line in lines if line]
    # The method before keepalive (nginx requires it); node a's two frontends share the
    # weight of node b's one.
    assert directives == [
        "hash $http_x_session_id consistent;",
        "server a:1 weight=1 max_fails=0;",
        "server b:7 weight=2 max_fails=0;",
        "server a:2 weight=1 max_fails=0;",
        "keepalive 32;",
    ]
    # A refused session request walks on over every frontend, like any other.
    assert "proxy_next_upstream error timeout http_503 http_429 non_idempotent;" in text
    assert "proxy_next_upstream_tries 3;" in text


def test_each_node_has_the_same_total_weight() -> None:
    renderer = load_renderer()
    nodes = [["a1", "a2", "a3"], ["b1", "b2", "b3", "b4"], ["c1"]]
    weights = renderer.node_weights(nodes)
    totals = {sum(weights[s] for s in node) for node in nodes}
    assert totals == {12}
    assert weights == {"a1": 4, "a2": 4, "a3": 4, "b1": 3, "b2": 3, "b3": 3, "b4": 3, "c1": 12}


def test_session_header_name() -> None:
    renderer = load_renderer()
    assert renderer.header_variable("X-Conversation-Id") == "$http_x_conversation_id"
    text = render("--node", "a:1", "--affinity", "--session-header", "X-Conversation-Id")
    assert "hash $http_x_conversation_id consistent;" in text
    assert "map $http_x_conversation_id $tinyserve_upstream" in text
    # nginx drops headers with "_" by default; anything else would not be a header name.
    for bad in ("X_Session", "X Session", "-X", "X-", "", "X;Y"):
        with pytest.raises(argparse.ArgumentTypeError):
            renderer.header_variable(bad)
    for args in (["--session-header", "X-A"], ["--affinity", "--session-header", "X_A"]):
        run = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True)
        assert run.returncode == 2 and "error:" in run.stderr, run.stderr


def nginx_test(prefix: Path) -> subprocess.CompletedProcess[str]:
    nginx = find_nginx()
    assert nginx is not None
    conf = str(prefix / "nginx.conf")
    argv = [nginx, "-t", "-p", str(prefix), "-c", conf, "-e", str(prefix / "error.log")]
    return subprocess.run(argv, capture_output=True, text=True)


@pytest.mark.skipif(find_nginx() is None, reason="nginx not installed (make test installs it)")
@pytest.mark.parametrize(
    "args",
    [
        ["--node", "127.0.0.1:8001-8002", "--node", "127.0.0.1:9001", "--affinity"],
        ["--node", "127.0.0.1:8001", "--affinity", "--session-header", "X-Conversation"],
        [
            "--node",
            "127.0.0.1:8001-8003",
            "--node",
            "127.0.0.1:9001-9004",
            "--node",
            "[::1]:7001",
            "--affinity",
        ],
    ],
)
def test_nginx_accepts_every_rendering(tmp_path: Path, args: list[str]) -> None:
    render(*args, "--listen", "127.0.0.1:18080", "--standalone", str(tmp_path))
    run = nginx_test(tmp_path)
    assert run.returncode == 0, run.stderr
    assert "warn" not in run.stderr, run.stderr
