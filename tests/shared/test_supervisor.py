"""The launcher's restart policy (back-off doubling to a cap, giving up on a crash loop) and a
child's watchdog (tests/integration/test_launcher.py: a hung engine or frontend restarted)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from tinyserve.supervisor import Child, RestartPolicy


def test_back_off_doubles_up_to_the_cap() -> None:
    policy = RestartPolicy(limit=100, interval_s=1000.0, first_delay_s=0.5, max_delay_s=10.0)
    delays = [policy.on_death(now=float(t)) for t in range(8)]
    assert delays == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0, 10.0]


def test_more_deaths_than_the_limit_within_the_interval_give_up() -> None:
    policy = RestartPolicy(limit=3, interval_s=60.0)
    assert [policy.on_death(now) for now in (0.0, 1.0, 2.0)] == [0.5, 1.0, 2.0]
    assert policy.on_death(59.0) is None
    assert policy.recent_deaths == 4


def test_deaths_older_than_the_interval_are_forgotten() -> None:
    policy = RestartPolicy(limit=2, interval_s=10.0)
    assert policy.on_death(0.0) == 0.5
    assert policy.on_death(1.0) == 1.0
    # A process that then ran well for the whole interval starts again from the first delay,
    # and its old deaths no longer count toward the limit.
    assert policy.on_death(11.5) == 0.5
    assert policy.recent_deaths == 1
    assert policy.on_death(12.0) == 1.0
    assert policy.on_death(13.0) is None


def test_limit_zero_never_restarts() -> None:
    assert RestartPolicy(limit=0, interval_s=120.0).on_death(5.0) is None


def test_a_child_gets_its_own_watchdog_and_is_hung_once_its_pings_stop(tmp_path: Path) -> None:
    # The child pings as an engine or frontend does: READY=1, then WATCHDOG=1 for a while.
    script = (
        "import os, socket, time\n"
        "s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)\n"
        "to = os.environ['NOTIFY_SOCKET']\n"
        "s.sendto(f\"READY=1\\nUSEC={os.environ['WATCHDOG_USEC']}\".encode(), to)\n"
        "s.sendto(b'PID=' + os.environ.get('WATCHDOG_PID', 'none').encode(), to)\n"
        "for _ in range(3):\n"
        "    time.sleep(0.1)\n"
        "    s.sendto(b'WATCHDOG=1', to)\n"
        "time.sleep(60)\n"
    )
    child = Child("c", [sys.executable, "-c", script], str(tmp_path / "n"), RestartPolicy(1, 1.0))
    child.watchdog_s = 0.5
    child.open_notify()
    os.environ["WATCHDOG_PID"] = "1"  # a systemd watchdog of ours: not passed on
    try:
        child.start()
        assert child.notify is not None
        child.notify.setblocking(True)
        first = child.notify.recv(4096)
        assert first == b"READY=1\nUSEC=500000"
        assert child.notify.recv(4096) == b"PID=none"
        child.notify.setblocking(False)
        child.alive_at = time.monotonic()  # as take_ready would have stamped the READY=1
        stamps = {child.alive_at}
        deadline = time.monotonic() + 5
        while len(stamps) < 4 and time.monotonic() < deadline:  # each ping: alive now
            child.take_ready()
            stamps.add(child.alive_at)
            assert not child.hung(time.monotonic())
            time.sleep(0.02)
        assert len(stamps) == 4
        # Then silence: hung once the watchdog's time has passed.
        time.sleep(0.6)
        child.take_ready()
        assert child.hung(time.monotonic())
    finally:
        del os.environ["WATCHDOG_PID"]
        if child.process is not None:
            child.process.kill()
            child.process.wait()
        child.close()


def test_without_a_watchdog_a_child_is_never_hung() -> None:
    child = Child("c", [], "", RestartPolicy(1, 1.0), alive_at=0.0)
    assert not child.hung(1e9)
