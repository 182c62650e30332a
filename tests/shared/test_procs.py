"""Process facts: children that die with their parent, and who listens on a port."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

from tinyserve.procs import describe, parent_pid, pid_alive, port_in_use, port_listeners

# A parent that starts a child with die_with_parent and prints the child's pid; the child
# writes "SIGTERM" to a file when that signal arrives.
PARENT = textwrap.dedent(
    """
    import subprocess, sys, time
    from tinyserve.procs import die_with_parent
    child = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]],
                             preexec_fn=die_with_parent())
    print(child.pid, flush=True)
    time.sleep(60)
    """
)
CHILD = textwrap.dedent(
    """
    import signal, sys, time
    from pathlib import Path
    def on_term(signum, frame):
        Path(sys.argv[1]).write_text(signal.Signals(signum).name)
        sys.exit(0)
    signal.signal(signal.SIGTERM, on_term)
    Path(sys.argv[1] + ".ready").touch()
    time.sleep(60)
    """
)


def test_a_child_gets_sigterm_when_its_parent_is_killed(tmp_path: Path) -> None:
    marker = tmp_path / "got"
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, CHILD, str(marker)], stdout=subprocess.PIPE, text=True
    )
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    try:
        wait_until(lambda: Path(f"{marker}.ready").exists())
        assert parent_pid(child) == parent.pid
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        wait_until(lambda: marker.exists())
        assert marker.read_text() == "SIGTERM"
    finally:
        if pid_alive(child):
            os.kill(child, signal.SIGKILL)


def test_port_in_use_and_who_listens() -> None:
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        listener.bind(("127.0.0.1", 0))
        port = listener.getsockname()[1]
        listener.listen()
        assert port_in_use("127.0.0.1", port)
        assert port_in_use("0.0.0.0", port)  # the wildcard address overlaps it
        assert port_listeners(port) == [os.getpid()]
    assert not port_in_use("127.0.0.1", port)
    assert port_listeners(port) == []
    assert not port_in_use("127.0.0.1", 0)


def test_describe_names_the_command() -> None:
    assert describe(os.getpid()).startswith(f"pid {os.getpid()} (")
    assert describe(2**22 + 1) == f"pid {2**22 + 1}"


def wait_until(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)
