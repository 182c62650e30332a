"""A real nginx, configured from the repo's template, run by the test user in a temp dir."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from tests.integration.node import free_port

REPO = Path(__file__).resolve().parents[2]
RENDER = REPO / "deploy" / "render_nginx.py"
START_TIMEOUT_S = 10.0


def find_nginx() -> str | None:
    """The nginx binary (Debian puts it in /usr/sbin, often not on a user's PATH)."""
    return shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin:/usr/local/sbin")


class Nginx:
    """``nginx`` in the foreground (``daemon off``) on a high loopback port."""

    def __init__(self, workdir: Path, *nodes: str, options: Sequence[str] = ()) -> None:
        """``nodes``: one ``--node`` value each; ``options``: more renderer flags
        (``--affinity``)."""
        binary = find_nginx()
        assert binary is not None, "nginx is not installed"
        self.binary = binary
        self.prefix = workdir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.access_log = workdir / "tinyserve.access.log"
        node_args = [arg for node in nodes for arg in ("--node", node)]
        listen = ["--listen", f"127.0.0.1:{self.port}"]
        standalone = ["--standalone", str(workdir), "--foreground"]
        render = [sys.executable, str(RENDER), *node_args, *listen, *standalone, *options]
        subprocess.run(render, check=True)
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> Nginx:
        conf = str(self.prefix / "nginx.conf")
        error_log = str(self.prefix / "error.log")
        # -e: the error log from the first moment, before the config names it (otherwise
        # nginx tries /var/log/nginx first, which the test user may not write).
        argv = [self.binary, "-p", str(self.prefix), "-c", conf, "-e", error_log]
        check = subprocess.run([*argv, "-t"], capture_output=True, text=True)
        assert check.returncode == 0, check.stderr
        self.process = subprocess.Popen(argv)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._listening():
            assert self.process.poll() is None, f"nginx exited:\n{self.error_log()}"
            assert time.monotonic() < deadline, f"nginx not listening:\n{self.error_log()}"
            time.sleep(0.02)
        return self

    def _listening(self) -> bool:
        with socket.socket() as probe:
            return probe.connect_ex(("127.0.0.1", self.port)) == 0

    def access_lines(self) -> list[str]:
        if not self.access_log.exists():
            return []
        return self.access_log.read_text().splitlines()

    def error_log(self) -> str:
        path = self.prefix / "error.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGQUIT)  # graceful: finish open requests, then exit
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait()
