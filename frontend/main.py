"""``tinyserve frontend``: run one HTTP frontend process until SIGTERM/SIGINT.

READY=1 goes to the notify socket (systemd or our launcher) only once the site listens AND the
engine handshake is done, so whoever waits for it can send traffic at once; again after each
new handshake (an engine restart), so that our launcher knows when the node serves again.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal

from aiohttp import web

from tinyserve import metrics
from tinyserve.config import Config, notify_socket, watchdog_interval_s
from tinyserve.errors import TinyServeError
from tinyserve.frontend.http.app import build_app, drain_app
from tinyserve.frontend.request.state import LINK
from tinyserve.logs import fields, setup_logging
from tinyserve.options import FRONTEND
from tinyserve.ownership import join_node
from tinyserve.rundir import prepare_runtime_dir
from tinyserve.sdnotify import Notifier
from tinyserve.tracing import from_config as tracing_from_config

log = logging.getLogger(__name__)

# After the drain: time for handlers to write the final event of a stream the drain ended.
FINAL_EVENTS_GRACE_S = 2.0


def run(config: Config) -> int:
    """Serve until stopped; 0 on a clean stop, 1 when start-up failed."""
    setup_logging(config, "frontend")
    os.umask(0o077)  # what we create (sockets, files) is ours alone, as the engine's is
    try:
        prepare_runtime_dir(config.runtime_dir)
        # Before anything in the runtime dir is touched, and before we share a port: a
        # runtime dir or a port owned by another node is refused (see tinyserve.ownership).
        node_lock = join_node(config, FRONTEND)
        # Before any metric value exists (see metrics.setup).
        process_metrics = metrics.setup(config.runtime_dir, metrics.FRONTEND)
        tracing = tracing_from_config(config, "frontend")
        app = build_app(config, tracing)
    except TinyServeError as exc:
        log.error("frontend failed to start: %s", exc)
        return 1
    try:
        return asyncio.run(_serve(config, app))
    finally:
        tracing.shutdown()  # exports the spans still buffered
        process_metrics.forget_process(os.getpid())  # our gauges go; our counters stay
        if node_lock is not None:
            node_lock.release()


async def _serve(config: Config, app: web.Application) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    notifier = Notifier(notify_socket())
    pings: asyncio.Task[None] | None = None
    # After a stop signal, drain_app refuses new requests and gives in-flight ones
    # drain_timeout seconds; handlers still running after a short grace are cancelled, which
    # cancels them in the engine too.
    runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=FINAL_EVENTS_GRACE_S)
    try:
        await runner.setup()
        url = await _listen(runner, config)
        if not await _wait_for_engine(app, stop, config.ready_timeout):
            return 0 if stop.is_set() else 1
        _report_links(app, notifier, url)
        every_s = watchdog_interval_s() if notifier.enabled else None
        if every_s:  # from the event loop itself: a loop that hangs stops pinging
            pings = asyncio.create_task(_ping_watchdog(notifier, every_s))
        await stop.wait()
        log.info("stopping")
        app[LINK].on_serving = None  # no READY=1 after our STOPPING=1
        notifier.stopping()
        await drain_app(app, config.drain_timeout)
        return 0
    except TinyServeError as exc:
        log.error("frontend failed to start: %s", exc)
        return 1
    except OSError as exc:
        log.error("cannot listen", extra=fields(host=config.host, port=config.port, error=str(exc)))
        return 1
    finally:
        if pings is not None:
            pings.cancel()
        await runner.cleanup()
        notifier.close()


def _report_links(app: web.Application, notifier: Notifier, url: str) -> None:
    """READY=1 now, and each time the link to an engine is up again. systemd takes a READY=1
    after the first as a no-op; our launcher logs that the node is whole again."""

    def serving() -> None:
        notifier.ready(f"serving on {url}")
        log.info("ready", extra=fields(url=url))

    serving()
    app[LINK].on_serving = serving


async def _ping_watchdog(notifier: Notifier, every_s: float) -> None:
    while True:
        notifier.watchdog()
        await asyncio.sleep(every_s)


async def _listen(runner: web.AppRunner, config: Config) -> str:
    """Start the TCP site (shared port via SO_REUSEPORT); returns the URL it listens on."""
    site = web.TCPSite(runner, config.host, config.port, reuse_port=True)
    await site.start()
    host, port = runner.addresses[0][:2]
    url = f"http://{host}:{port}"
    log.info("listening", extra=fields(url=url))
    return url


async def _wait_for_engine(app: web.Application, stop: asyncio.Event, timeout_s: int) -> bool:
    """Wait for the first engine handshake; False on timeout or a stop signal."""
    serving = asyncio.ensure_future(app[LINK].serving.wait())
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait(
            {serving, stopping}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED
        )
    finally:
        serving.cancel()
        stopping.cancel()
    if app[LINK].serving.is_set():
        return True
    if not stop.is_set():
        log.error("no engine handshake in time", extra=fields(timeout_s=timeout_s))
    return False
