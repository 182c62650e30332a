"""``tinyserve serve``: one engine and N frontends on this machine, supervised as one node.

Before touching anything in the runtime dir, the launcher claims it and the port
(``ownership.claim_node``): a second node over a live one refuses to start instead of
unlinking its sockets or metrics. Each child reports readiness with the sd_notify protocol
on a socket of its own, exactly as it would to systemd; a frontend reports it again each
time its link to an engine is up. The node is ready when every child is: the launcher then
logs ``ready on URL`` (and sends its own READY=1 the first time), and again each time the
node is whole after a death.

A child that dies while the node runs is restarted after a back-off (``RestartPolicy``);
one that dies too often, or during the node's first start, stops the node. A child that
hangs is made to die, as systemd's ``WatchdogSec`` would: each pings ``WATCHDOG=1`` from its
main loop, and one silent for ``--watchdog-sec`` after its READY=1 gets SIGABRT (its Python
stacks go to the log), then SIGKILL if it is still there after a grace. On
Ctrl-C/SIGTERM the frontends stop first (they drain their streams while the engine still
runs), then the engine. Should the launcher itself die, even by SIGKILL, the kernel sends
every child SIGTERM (``procs.die_with_parent``), so they drain and exit too.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import select
import signal
import subprocess
import sys
import time
from types import FrameType

from tinyserve.config import Config, notify_socket
from tinyserve.errors import TinyServeError
from tinyserve.logs import setup_logging
from tinyserve.metrics import remove_metrics_dir
from tinyserve.options import ENGINE, FRONTEND
from tinyserve.ownership import claim_node
from tinyserve.rundir import prepare_runtime_dir
from tinyserve.sdnotify import Notifier
from tinyserve.supervisor import Child, RestartPolicy

log = logging.getLogger(__name__)

# A signalled child (SIGTERM after its drain, SIGABRT when hung) has this long before SIGKILL.
KILL_GRACE_S = 5.0
NOTIFY_POLL_S = 0.2  # the longest a wait for sd_notify messages blocks


class NodeFailed(Exception):
    """The node cannot go on: a child failed to start, or died too often."""


class Launcher:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.stop_requested = False
        self.whole = False  # every child ready, as last announced
        run = config.runtime_dir
        python = [sys.executable, "-m", "tinyserve.cli"]
        # Our frontends share one port, so each says ready only once all of them serve.
        frontend_config = dataclasses.replace(config, ready_frontends=config.frontends)
        self.engine = Child(
            "engine",
            [*python, ENGINE, *config.flags_for(ENGINE)],
            os.path.join(run, "notify-engine"),
            self._policy(),
            watchdog_s=config.watchdog_sec,
        )
        self.frontends = [
            Child(
                f"frontend {i}",
                [*python, FRONTEND, *frontend_config.flags_for(FRONTEND)],
                os.path.join(run, f"notify-frontend-{i}"),
                self._policy(),
                config.secret_env_for(FRONTEND),
                config.watchdog_sec,
            )
            for i in range(config.frontends)
        ]

    def _policy(self) -> RestartPolicy:
        return RestartPolicy(self.config.restart_limit, self.config.restart_interval)

    @property
    def children(self) -> list[Child]:
        return [self.engine, *self.frontends]

    @property
    def url(self) -> str:
        """Where the node serves (an IPv6 address in brackets)."""
        host = f"[{self.config.host}]" if ":" in self.config.host else self.config.host
        return f"http://{host}:{self.config.port}"

    def announce_when_whole(self) -> None:
        """Log ``ready on URL`` when every child has become ready (again)."""
        whole = all(child.ready for child in self.children)
        if whole and not self.whole:
            log.info(
                "ready on %s (%d frontends, engine pid %d)",
                self.url,
                len(self.frontends),
                self.engine.pid,
            )
        self.whole = whole

    def on_signal(self, _signum: int, _frame: FrameType | None) -> None:
        self.stop_requested = True

    # -- first start: any death stops the node ----------------------------------------------

    def start(self) -> None:
        for child in self.children:
            child.open_notify()
        self.engine.start()
        self._wait_ready([self.engine])
        for child in self.frontends:
            child.start()
        self._wait_ready(self.frontends)
        self.announce_when_whole()

    def _wait_ready(self, children: list[Child]) -> None:
        pending = list(children)
        while pending and not self.stop_requested:
            self._wait_for_notifications(pending)
            for child in [c for c in pending if c.take_ready()]:
                log.info("%s ready (pid %d)", child.name, child.pid)
                pending.remove(child)
            for child in self.children:
                ended = child.exit_description()
                if ended is not None:
                    raise NodeFailed(
                        f"node failed to start: {child.name} (pid {child.pid}) {ended}"
                    )

    def _wait_for_notifications(self, children: list[Child]) -> None:
        sockets = [c.notify for c in children if c.notify is not None]
        select.select(sockets, [], [], NOTIFY_POLL_S)

    # -- running: restart what dies ----------------------------------------------------------

    def supervise(self) -> None:
        while not self.stop_requested:
            self._wait_for_notifications(self.children)
            now = time.monotonic()
            # Every notification before any death: a READY=1 read now was sent before the
            # deaths noticed now, so a frontend that lost its engine is not taken as ready.
            for child in self.children:
                if child.take_ready():
                    log.info("%s ready (pid %d)", child.name, child.pid)
            for child in self.children:
                self._tend(child, now)
            self.announce_when_whole()

    def _tend(self, child: Child, now: float) -> None:
        """Restart ``child`` when its back-off is over; notice its death."""
        if child.restart_at is not None:
            if now >= child.restart_at and not self.stop_requested:
                child.start()
                log.info("%s restarted (pid %d)", child.name, child.pid)
            return
        ended = child.exit_description()
        if self.stop_requested:
            return
        if ended is None:
            self._watch(child, now)
            return
        child.ready = False
        if child is self.engine:  # their links went with it: ready again once relinked
            for frontend in self.frontends:
                frontend.ready = False
        what = f"{child.name} (pid {child.pid}) {ended}"
        delay = child.policy.on_death(now)
        if delay is None:
            deaths = child.policy.recent_deaths
            times = "once" if deaths == 1 else f"{deaths} times"
            raise NodeFailed(
                f"{what}; it died {times} within {child.policy.interval_s:g} s "
                f"(--restart-limit {child.policy.limit})"
            )
        log.error("%s; restarting it in %.1f s", what, delay)
        child.restart_at = now + delay

    def _watch(self, child: Child, now: float) -> None:
        """SIGABRT to a child that stopped pinging; SIGKILL once the grace is over (a
        stopped process never takes the SIGABRT). Its death then restarts it."""
        assert child.process is not None
        if child.aborted_at is not None:
            if now - child.aborted_at > KILL_GRACE_S:
                child.process.kill()
            return
        if child.hung(now):
            log.error(
                "%s (pid %d) sent no watchdog ping for %g s (--watchdog-sec); aborting it",
                child.name,
                child.pid,
                child.watchdog_s,
            )
            child.process.send_signal(signal.SIGABRT)
            child.aborted_at = now

    # -- stop --------------------------------------------------------------------------------

    def stop(self) -> None:
        """Frontends first, then the engine; anything still alive after the grace is killed."""
        for group in (self.frontends, [self.engine]):
            running = [c for c in group if c.running]
            for child in running:
                child.process.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
            deadline = time.monotonic() + self.config.drain_timeout + KILL_GRACE_S
            for child in running:
                self._reap(child, deadline)
        for child in self.children:
            child.close()

    @staticmethod
    def _reap(child: Child, deadline: float) -> None:
        assert child.process is not None
        try:
            child.process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            log.warning("%s (pid %d) did not stop in time; killing it", child.name, child.pid)
            child.process.kill()
            child.process.wait()


def run(config: Config) -> int:
    """Entry point of ``tinyserve serve``."""
    setup_logging(config, "serve")
    os.umask(0o077)  # notify sockets, and the children inherit it
    try:
        prepare_runtime_dir(config.runtime_dir)
        lock = claim_node(config)  # before anything in the runtime dir is touched
    except TinyServeError as exc:
        log.error("node failed to start: %s", exc)
        return 1
    try:
        # Counters start from zero with each node; a launcher killed by SIGKILL left its own.
        remove_metrics_dir(config.runtime_dir)
        return _serve(Launcher(config))
    finally:
        remove_metrics_dir(config.runtime_dir)
        lock.release()


def _serve(launcher: Launcher) -> int:
    signal.signal(signal.SIGINT, launcher.on_signal)
    signal.signal(signal.SIGTERM, launcher.on_signal)
    try:
        launcher.start()
        if not launcher.stop_requested:
            Notifier(notify_socket()).ready(f"ready on {launcher.url}")
            launcher.supervise()
    except NodeFailed as exc:
        log.error("%s; stopping the node", exc)
        return 1
    finally:
        launcher.stop()
    return 0
