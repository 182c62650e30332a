"""Render deploy/nginx/tinyserve.conf.template for the frontends of one or more nodes.

    # one node, four frontends (tinyserve-frontend@8001..8004), nginx on port 80:
    python deploy/render_nginx.py --node 127.0.0.1:8001-8004 > /etc/nginx/conf.d/tinyserve.conf
    # two nodes:
    python deploy/render_nginx.py --node 10.0.0.11:8001-8004 --node 10.0.0.12:8001-8004
    # a self-contained, unprivileged nginx in DIR (tests, trying it out):
    python deploy/render_nginx.py --node 127.0.0.1:8001-8002 --listen 127.0.0.1:8080 \
        --standalone DIR && nginx -p DIR -c DIR/nginx.conf -e stderr
    # session affinity: requests with an X-Session-Id header stick to one node:
    python deploy/render_nginx.py --node 10.0.0.11:8001-8004 --node 10.0.0.12:8001-8004 --affinity

Servers are listed node by node in turn (a1, b1, a2, b2, ...), so the frontend nginx tries
after a 503 is usually on another node; every frontend is tried at most once.

With ``--affinity``, a request that carries the session header goes to a second upstream
that picks a frontend by a consistent hash of the header's value (``hash ... consistent``,
ketama: 160 points on a ring per unit of weight); requests without it keep the round robin.
The node, not the frontend, holds a conversation's cached prefix, so the weights give every
node the same share of the ring whatever its number of frontends (a node with two frontends
gives each weight 2 where a node with four gives each 1). A refused or unreachable frontend
still hands the request on: the hash walks on round the ring to the next untried frontend,
the same one each time for a given session, so a dead node's sessions all settle on one
other node each and warm its cache.
Standard library only: it runs before any virtual environment exists.
"""

from __future__ import annotations

import argparse
import getpass
import grp
import itertools
import math
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent / "nginx"
SITE_TEMPLATE = HERE / "tinyserve.conf.template"
STANDALONE_TEMPLATE = HERE / "nginx-standalone.conf.template"
PLACEHOLDER = re.compile(r"\{\{(\w+)\}\}")
# Header names nginx exposes as $http_<name> (lower case, "-" as "_"); nginx drops headers
# with an underscore unless told otherwise, so none is allowed here.
HEADER_NAME = re.compile(r"[A-Za-z0-9]+(-[A-Za-z0-9]+)*")
DEFAULT_SESSION_HEADER = "X-Session-Id"


def parse_node(text: str) -> list[str]:
    """``HOST:PORT``, ``HOST:FIRST-LAST`` or ``HOST:P1,P2`` -> ``["HOST:PORT", ...]``."""
    host, sep, ports = text.rpartition(":")
    if not sep or not host:
        raise argparse.ArgumentTypeError(f"expected HOST:PORTS, got {text!r}")
    numbers: list[int] = []
    for part in ports.split(","):
        first, _, last = part.partition("-")
        try:
            low, high = int(first), int(last or first)
        except ValueError:
            raise argparse.ArgumentTypeError(f"bad port list in {text!r}") from None
        if not 0 < low <= high < 65536:
            raise argparse.ArgumentTypeError(f"bad port range in {text!r}")
        numbers.extend(range(low, high + 1))
    return [f"{host}:{port}" for port in numbers]


def interleave(nodes: Sequence[Sequence[str]]) -> list[str]:
    """Servers of every node in turn: [[a1, a2], [b1]] -> [a1, b1, a2]."""
    rounds = itertools.zip_longest(*nodes)
    return [server for row in rounds for server in row if server is not None]


def header_variable(name: str) -> str:
    """The nginx variable holding a request header: ``X-Session-Id`` -> ``$http_x_session_id``."""
    if not HEADER_NAME.fullmatch(name):
        raise argparse.ArgumentTypeError(f"bad header name {name!r} (letters, digits, '-')")
    return "$http_" + name.lower().replace("-", "_")


def node_weights(nodes: Sequence[Sequence[str]]) -> dict[str, int]:
    """Each frontend's weight in the hash ring, so that every node's frontends add up to the
    same total: [[a1, a2], [b1]] -> {a1: 1, a2: 1, b1: 2}."""
    total = math.lcm(*(len(node) for node in nodes))
    return {server: total // len(node) for node in nodes for server in node}


def render_affinity(nodes: Sequence[Sequence[str]], header: str) -> str:
    """The map and the hash upstream that ``--affinity`` adds after the round-robin one."""
    variable = header_variable(header)
    weights = node_weights(nodes)
    servers = "\n".join(
        f"    server {s} weight={weights[s]} max_fails=0;" for s in interleave(nodes)
    )
    return f"""
# Session affinity (--affinity): a request that names its conversation in {header} goes
# to the node that served its earlier turns, where the prefix cache still holds them.
# Requests without the header (or with an empty one) keep the round robin above.
map {variable} $tinyserve_upstream {{
    "" tinyserve;
    default tinyserve_affinity;
}}

upstream tinyserve_affinity {{
    # Consistent hash (ketama) over every frontend, weighted so that each node holds the
    # same share of the ring however many frontends it has: the node is what caches.
    # A 503/429 or an unreachable frontend walks on round the ring to the next untried
    # frontend, the same one every time for a session (proxy_next_upstream below).
    # The method comes before keepalive, as nginx requires.
    hash {variable} consistent;
{servers}
    keepalive 32;
}}
"""


def fill(template: str, values: dict[str, str]) -> str:
    """Replace every ``{{name}}``; a placeholder without a value is an error."""
    missing = set(PLACEHOLDER.findall(template)) - set(values)
    if missing:
        raise KeyError(f"no value for {sorted(missing)}")
    return PLACEHOLDER.sub(lambda m: values[m.group(1)], template)


def render_site(nodes: Sequence[Sequence[str]], options: argparse.Namespace) -> str:
    """The tinyserve.conf text for these nodes' frontends."""
    servers = interleave(nodes)
    frontends = "frontend" if len(servers) == 1 else "frontends"
    where = "one node" if len(nodes) == 1 else f"{len(nodes)} nodes"
    return fill(
        SITE_TEMPLATE.read_text(),
        {
            "description": f"{len(servers)} {frontends} on {where}",
            "servers": "\n".join(f"    server {s} max_fails=0;" for s in servers),
            "listen": options.listen,
            "server_name": options.server_name,
            "access_log": options.access_log,
            "client_max_body_size": options.client_max_body_size,
            "read_timeout": options.read_timeout,
            "connect_timeout": options.connect_timeout,
            "tries": str(len(servers)),
            "next_upstream_timeout": options.next_upstream_timeout,
            "affinity": render_affinity(nodes, options.session_header) if options.affinity else "",
            "upstream": "$tinyserve_upstream" if options.affinity else "tinyserve",
        },
    )


def write_standalone(prefix: Path, site: str, foreground: bool) -> None:
    """nginx.conf + tinyserve.conf + temp dirs in ``prefix``, for an nginx run by this user."""
    (prefix / "tmp").mkdir(parents=True, exist_ok=True)
    # As root, nginx would hand its workers to "nobody", who cannot use our files: keep them
    # as the user who runs it. Anyone else: nginx stays that user by itself.
    user = ""
    if os.geteuid() == 0:
        user = f"user {getpass.getuser()} {grp.getgrgid(os.getegid()).gr_name};\n"
    main = fill(
        STANDALONE_TEMPLATE.read_text(),
        {"prefix": str(prefix), "user": user, "daemon": "off" if foreground else "on"},
    )
    (prefix / "nginx.conf").write_text(main)
    (prefix / "tinyserve.conf").write_text(site)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--node",
        dest="nodes",
        action="append",
        type=parse_node,
        help="one node's frontends: HOST:PORT, HOST:FIRST-LAST or HOST:P1,P2 (repeat per node; "
        "default 127.0.0.1:8001-8002)",
    )
    parser.add_argument("--listen", default="80", help="nginx listen address (default 80)")
    parser.add_argument("--server-name", default="_", help="server_name (default _)")
    parser.add_argument("--access-log", default=None, help="access log path")
    parser.add_argument("--client-max-body-size", default="1m")
    parser.add_argument("--read-timeout", default="300s", help="longest silence from a frontend")
    parser.add_argument("--connect-timeout", default="2s")
    parser.add_argument(
        "--next-upstream-timeout", default="10s", help="how long a request may be passed on"
    )
    parser.add_argument(
        "--affinity",
        action="store_true",
        help="send requests that carry the session header to one node (consistent hash)",
    )
    parser.add_argument(
        "--session-header",
        help=f"with --affinity: the header that names a conversation ({DEFAULT_SESSION_HEADER})",
    )
    parser.add_argument(
        "--standalone", type=Path, metavar="DIR", help="write a complete nginx setup into DIR"
    )
    parser.add_argument(
        "--foreground", action="store_true", help="with --standalone: daemon off (supervised)"
    )
    parser.add_argument("-o", "--output", type=Path, help="write here instead of stdout")
    options = parser.parse_args(argv)
    options.nodes = options.nodes or [parse_node("127.0.0.1:8001-8002")]
    if options.session_header and not options.affinity:
        parser.error("--session-header needs --affinity")
    options.session_header = options.session_header or DEFAULT_SESSION_HEADER
    try:
        header_variable(options.session_header)
    except argparse.ArgumentTypeError as exc:
        parser.error(str(exc))
    if options.access_log is None:
        logs = options.standalone.resolve() if options.standalone else Path("/var/log/nginx")
        options.access_log = str(logs / "tinyserve.access.log")
    return options


def main(argv: Sequence[str] | None = None) -> int:
    options = parse_args(argv)
    site = render_site(options.nodes, options)
    if options.standalone:
        write_standalone(options.standalone.resolve(), site, options.foreground)
    elif options.output:
        options.output.write_text(site)
    else:
        sys.stdout.write(site)
    return 0


if __name__ == "__main__":
    sys.exit(main())
