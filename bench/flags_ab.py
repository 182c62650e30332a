"""TinyServe against itself with other flags or other code: the load points of
``vs_llama_server.py``, on two nodes at once, driven alternately, in one run.

Node A runs with ``--a`` flags, node B with ``--b`` (both on top of the shared settings:
model, threads, ctx-per-slot, slots, frontends); with ``--a-commit``, node A runs that
commit's Python code (``common.code_at``), for a change measured against the code before it
(a commit from before issue 32 knows no ``--ctx-per-slot``). Every load
point runs ``--rounds`` rounds, the order alternating, and is printed as the medians of each
node and the ratio B / A, median [range] over rounds. Writes ``bench/results/<--name>.csv``.
For choosing a default or keeping a change (the write-ups in docs/benchmarks.md name the
command), with the same client and figures as the comparison with llama-server.

    .venv/bin/python bench/flags_ab.py --b="--host-cache-mb 0" --workloads closed,chat
    .venv/bin/python bench/flags_ab.py --a-commit HEAD --workloads closed --concurrency 8
"""

from __future__ import annotations

import argparse
import shlex

from common import code_at, write_csv
from vs_llama_server import alternate, load_arguments, start_tinyserve


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    load_arguments(parser)
    parser.add_argument("--a", default="", help="node A's extra flags (one string)")
    parser.add_argument("--b", default="", help="node B's extra flags (one string)")
    parser.add_argument("--a-commit", metavar="COMMIT", help="node A runs this commit's code")
    parser.add_argument("--name", default="flags_ab", help="the CSV's name in bench/results/")
    args = parser.parse_args()

    from tinyserve.model import resolve_model_path

    model_path = resolve_model_path(None)
    servers = []
    with code_at(args.a_commit) as a_code:
        try:
            for name, flags, code in (("A", args.a, a_code), ("B", args.b, None)):
                node_args = argparse.Namespace(**vars(args), tinyserve_flag=shlex.split(flags))
                servers.append(start_tinyserve(node_args, model_path, name, code))
            a = f"{args.a or '(defaults)'}{f' at {args.a_commit}' if args.a_commit else ''}"
            print(f"A: {a}; B: {args.b or '(defaults)'}; {args.rounds} rounds")
            rows = alternate(servers, args)
        finally:
            for server in servers:
                server.stop()
    print(f"\nwrote {write_csv(args.name, rows)}")


if __name__ == "__main__":
    main()
