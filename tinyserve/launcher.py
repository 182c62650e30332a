"""``tinyserve serve``: one engine and N frontends on this machine, started and stopped as one.

Each child reports readiness with the sd_notify protocol on a socket of its own, exactly as it
would to systemd. On Ctrl-C/SIGTERM the frontends stop first (they drain their streams while
the engine still runs), then the engine. If a child dies, the launcher says which and why and
stops the rest.
"""

from __future__ import annotations

import logging
import os
import select
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from types import FrameType

from tinyserve.config import ENGINE, FRONTEND, Config, notify_socket
from tinyserve.errors import TinyServeError
from tinyserve.logs import setup_logging
from tinyserve.metrics import remove_metrics_dir
from tinyserve.rundir import prepare_runtime_dir, remove_quietly
from tinyserve.sdnotify import Notifier

log = logging.getLogger(__name__)

STOP_GRACE_S = 5.0


@dataclass
class Child:
    """One supervised process and the notify socket it reports READY=1 on."""

    name: str
    argv: list[str]
    notify_path: str
    secret_env: dict[str, str] = field(default_factory=dict)  # kept off the command line
    process: subprocess.Popen[bytes] | None = None
    notify: socket.socket = field(init=False)

    def __post_init__(self) -> None:
        remove_quietly(self.notify_path)
        self.notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self.notify.bind(self.notify_path)

    def start(self) -> None:
        env = dict(os.environ, **self.secret_env, NOTIFY_SOCKET=self.notify_path)
        # A session of its own: a terminal's Ctrl-C reaches only us, and we stop the
        # children in order instead of all at once.
        self.process = subprocess.Popen(self.argv, env=env, start_new_session=True)

    @property
    def pid(self) -> int:
        return self.process.pid if self.process else 0

    def exit_description(self) -> str | None:
        """None while running, else how it ended, in words."""
        code = self.process.poll() if self.process else None
        if code is None:
            return None
        if code < 0:
            return f"killed by {signal.Signals(-code).name}"
        return f"exited with status {code}"

    def close(self) -> None:
        self.notify.close()
        remove_quietly(self.notify_path)


class ChildDied(Exception):
    """A child ended while the node was supposed to be running."""


class Launcher:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.stop_requested = False
        run = config.runtime_dir
        python = [sys.executable, "-m", "tinyserve.cli"]
        self.engine = Child(
            "engine",
            [*python, ENGINE, *config.flags_for(ENGINE)],
            os.path.join(run, "notify-engine"),
        )
        self.frontends = [
            Child(
                f"frontend {i}",
                [*python, FRONTEND, *config.flags_for(FRONTEND)],
                os.path.join(run, f"notify-frontend-{i}"),
                config.secret_env_for(FRONTEND),
            )
            for i in range(config.frontends)
        ]

    @property
    def children(self) -> list[Child]:
        return [self.engine, *self.frontends]

    def on_signal(self, _signum: int, _frame: FrameType | None) -> None:
        self.stop_requested = True

    def start(self) -> None:
        self.engine.start()
        self._wait_ready([self.engine])
        for child in self.frontends:
            child.start()
        self._wait_ready(self.frontends)

    def _wait_ready(self, children: list[Child]) -> None:
        pending = {c.notify.fileno(): c for c in children}
        while pending and not self.stop_requested:
            readable, _, _ = select.select(list(pending), [], [], 0.2)
            for fd in readable:
                child = pending[fd]
                if b"READY=1" in child.notify.recv(4096).split(b"\n"):
                    log.info("%s ready (pid %d)", child.name, child.pid)
                    del pending[fd]
            self._check_alive()

    def _check_alive(self) -> None:
        for child in self.children:
            ended = child.exit_description()
            if ended is not None:
                raise ChildDied(f"{child.name} (pid {child.pid}) {ended}")

    def supervise(self) -> None:
        while not self.stop_requested:
            time.sleep(0.2)
            self._check_alive()

    def stop(self) -> None:
        """Frontends first, then the engine; anything still alive after the grace is killed."""
        for group in (self.frontends, [self.engine]):
            running = [c for c in group if c.process and c.process.poll() is None]
            for child in running:
                child.process.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
            deadline = time.monotonic() + self.config.drain_timeout + STOP_GRACE_S
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
    except TinyServeError as exc:
        log.error("node failed to start: %s", exc)
        return 1
    launcher = Launcher(config)
    signal.signal(signal.SIGINT, launcher.on_signal)
    signal.signal(signal.SIGTERM, launcher.on_signal)
    status = 0
    try:
        launcher.start()
        if not launcher.stop_requested:
            Notifier(notify_socket()).ready(f"{config.frontends} frontends on port {config.port}")
            log.info(
                "TinyServe listening on http://%s:%d (%d frontends, engine pid %d); "
                "Ctrl-C stops it",
                config.host,
                config.port,
                config.frontends,
                launcher.engine.pid,
            )
            launcher.supervise()
    except ChildDied as exc:
        log.error("%s; stopping the node", exc)
        status = 1
    finally:
        launcher.stop()
        # The node is gone: its counters start again from zero with the next one.
        remove_metrics_dir(config.runtime_dir)
    return status
