"""``tinyserve engine``: the engine process's entry point (``EngineProcess`` in ``proc.py``)."""

from __future__ import annotations

import logging
import os
import signal

from tinyserve import metrics
from tinyserve.config import Config
from tinyserve.engine.proc import EngineProcess
from tinyserve.errors import TinyServeError
from tinyserve.logs import setup_logging
from tinyserve.options import ENGINE
from tinyserve.ownership import join_node
from tinyserve.rundir import prepare_runtime_dir

log = logging.getLogger(__name__)


def run(config: Config) -> int:
    """Entry point of ``tinyserve engine``."""
    setup_logging(config, "engine")
    # Sockets and the board are created by us: nobody else gets any access bit on them,
    # whatever umask we were started with (the runtime dir is 0700 as well).
    os.umask(0o077)
    try:
        prepare_runtime_dir(config.runtime_dir)
        # Before anything in the runtime dir is touched: a live node's engine (or a launcher
        # that is not our parent) owns it, and its metrics and board must stay as they are.
        lock = join_node(config, ENGINE)
    except TinyServeError as exc:
        log.error("engine failed to start: %s", exc)
        return 1
    try:
        return _run_engine(config)
    finally:
        if lock is not None:
            lock.release()


def _run_engine(config: Config) -> int:
    try:
        metrics.setup(config.runtime_dir, metrics.ENGINE)  # before any metric value exists
        engine = EngineProcess(config)
    except TinyServeError as exc:
        log.error("engine failed to start: %s", exc)
        return 1
    signal.signal(signal.SIGTERM, engine.request_stop)
    signal.signal(signal.SIGINT, engine.request_stop)
    try:
        engine.start()
        engine.serve()
    finally:
        engine.close()
        engine.meter.metrics.forget_process(os.getpid())  # no engine: no engine gauges
    log.info("engine stopped")
    return 0
