"""``tinyserve serve|engine|frontend``: one console script, one subcommand per process kind.

A package of its own, above the rest: it is the one place that imports both the engine and
the frontend (``bench/import_cycles.py`` finds no folder that imports back)."""

from __future__ import annotations

import argparse
import faulthandler
from collections.abc import Sequence

from tinyserve.config import add_arguments, build_config
from tinyserve.options import ENGINE, FRONTEND, SERVE

_HELP = {
    SERVE: "start one engine and N frontends on this machine",
    ENGINE: "run the engine process (owns the model)",
    FRONTEND: "run one HTTP frontend process",
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tinyserve", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    for role, text in _HELP.items():
        add_arguments(commands.add_parser(role, help=text, description=text), role)
    args = parser.parse_args(argv)
    config = build_config(args, role=args.command)
    # A crash in native code, or the SIGABRT a watchdog sends a hung process, prints every
    # thread's Python stack to stderr (the log) first: where it died or hung.
    faulthandler.enable(all_threads=True)
    if args.command == ENGINE:
        from tinyserve.engine.main import run as run_engine

        return run_engine(config)
    if args.command == FRONTEND:
        from tinyserve.frontend.main import run as run_frontend

        return run_frontend(config)
    from tinyserve.launcher import run as run_launcher

    return run_launcher(config)
