"""The pieces of ``tinyserve serve``'s supervision: when to restart, and one child process.

``RestartPolicy`` is plain logic on a clock the caller passes in (tests drive it directly).
``Child`` is one engine or frontend process with the sd_notify socket it reports READY=1 and
its watchdog pings on (``WATCHDOG_USEC`` is set for it as systemd's ``WatchdogSec`` would),
started so that it dies with the launcher (``procs.die_with_parent``).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections import deque
from dataclasses import dataclass, field

from tinyserve.procs import die_with_parent
from tinyserve.rundir import remove_quietly

FIRST_DELAY_S = 0.5
MAX_DELAY_S = 10.0


@dataclass
class RestartPolicy:
    """Restart a dead process after a back-off that doubles with each recent death (0.5 s,
    1 s, 2 s, … up to 10 s); give up once it died more than ``limit`` times within
    ``interval_s``, like systemd's ``StartLimitBurst``/``StartLimitIntervalSec``.

    Deaths older than the interval are forgotten, so a process that has run well for that
    long starts again from the shortest delay. ``limit`` 0: never restart.
    """

    limit: int
    interval_s: float
    first_delay_s: float = FIRST_DELAY_S
    max_delay_s: float = MAX_DELAY_S
    _deaths: deque[float] = field(default_factory=deque)

    def on_death(self, now: float) -> float | None:
        """Record a death at ``now`` (seconds); the delay before restarting, or None to give
        up."""
        self._deaths.append(now)
        while self._deaths[0] <= now - self.interval_s:
            self._deaths.popleft()
        if self.recent_deaths > self.limit:
            return None
        return min(self.max_delay_s, self.first_delay_s * 2.0 ** (self.recent_deaths - 1))

    @property
    def recent_deaths(self) -> int:
        """Deaths within the interval before the last one recorded, that one included."""
        return len(self._deaths)


@dataclass
class Child:
    """One supervised process and the notify socket it reports READY=1 on."""

    name: str
    argv: list[str]
    notify_path: str
    policy: RestartPolicy
    secret_env: dict[str, str] = field(default_factory=dict)  # kept off the command line
    watchdog_s: float = 0.0  # once ready, a ping at least this often or it is hung (0: off)
    process: subprocess.Popen[bytes] | None = None
    restart_at: float | None = None  # while dead: when to start it again (monotonic)
    notify: socket.socket | None = None
    alive_at: float | None = None  # its last READY=1 or WATCHDOG=1 (monotonic); None before
    # READY=1 since it started; the launcher clears it when it dies (a frontend's, too, when
    # the engine dies: its link is gone until it reports READY=1 again).
    ready: bool = False
    aborted_at: float | None = None  # when the launcher sent it SIGABRT as hung

    def open_notify(self) -> None:
        """Bind the notify socket (replacing a stale one: call it only in a runtime dir that
        this launcher owns)."""
        remove_quietly(self.notify_path)
        self.notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self.notify.bind(self.notify_path)
        self.notify.setblocking(False)

    def start(self) -> None:
        self.take_ready()  # a READY=1 left by the previous incarnation is not this one's
        self.alive_at = self.aborted_at = None
        self.ready = False
        env = dict(os.environ, **self.secret_env, NOTIFY_SOCKET=self.notify_path)
        env.pop("WATCHDOG_PID", None)  # a systemd watchdog of the launcher's is not its own
        env.pop("WATCHDOG_USEC", None)
        if self.watchdog_s:
            env["WATCHDOG_USEC"] = str(int(self.watchdog_s * 1e6))
        # A session of its own: a terminal's Ctrl-C reaches only us, and we stop the
        # children in order instead of all at once. If we die, even by SIGKILL, the kernel
        # sends it SIGTERM, which drains it: no process of the node outlives its launcher.
        self.process = subprocess.Popen(
            self.argv, env=env, start_new_session=True, preexec_fn=die_with_parent()
        )
        self.restart_at = None

    @property
    def pid(self) -> int:
        return self.process.pid if self.process else 0

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def take_ready(self) -> bool:
        """Read every pending notification; whether one of them said READY=1. Either that
        or WATCHDOG=1 says it is alive now."""
        ready = False
        while self.notify is not None:
            try:
                lines = self.notify.recv(4096).split(b"\n")
            except BlockingIOError:
                break
            ready = ready or b"READY=1" in lines
            if b"READY=1" in lines or (self.alive_at is not None and b"WATCHDOG=1" in lines):
                self.alive_at = time.monotonic()
        self.ready = self.ready or ready
        return ready

    def hung(self, now: float) -> bool:
        """Ready once, and no ping for longer than its watchdog allows."""
        return (
            bool(self.watchdog_s)
            and self.alive_at is not None
            and (now - self.alive_at > self.watchdog_s)
        )

    def exit_description(self) -> str | None:
        """None while running (or never started), else how it ended, in words."""
        code = self.process.poll() if self.process else None
        if code is None:
            return None
        if code < 0:
            return f"killed by {signal.Signals(-code).name}"
        return f"exited with status {code}"

    def close(self) -> None:
        if self.notify is not None:
            self.notify.close()
            self.notify = None
            remove_quietly(self.notify_path)
