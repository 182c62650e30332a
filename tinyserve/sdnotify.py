"""The sd_notify protocol: one datagram to ``$NOTIFY_SOCKET`` per state change.

systemd (``Type=notify``) and our own launcher both listen on such a socket, so the same
``READY=1`` tells either of them that a process is serving. No dependency needed.
"""

from __future__ import annotations

import os
import socket


class Notifier:
    """Sends ``KEY=value`` lines to the notify socket; does nothing when there is none."""

    def __init__(self, address: str | None) -> None:
        self._address = address
        self._sock: socket.socket | None = None
        if address:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)

    @property
    def enabled(self) -> bool:
        return self._sock is not None

    def notify(self, *lines: str) -> bool:
        """Send ``lines`` as one message; returns False when nobody listens."""
        if self._sock is None or self._address is None:
            return False
        # A leading "@" names a socket in the abstract namespace.
        target = "\0" + self._address[1:] if self._address.startswith("@") else self._address
        try:
            # Never wait: a listener that stopped reading (its queue holds only a few
            # datagrams) must not stall the engine loop that pings the watchdog.
            self._sock.sendto("\n".join(lines).encode(), socket.MSG_DONTWAIT, target)
        except OSError:
            return False
        return True

    def ready(self, status: str = "") -> bool:
        lines = ["READY=1", f"MAINPID={os.getpid()}"]
        return self.notify(*lines, f"STATUS={status}") if status else self.notify(*lines)

    def stopping(self) -> bool:
        return self.notify("STOPPING=1")

    def watchdog(self) -> bool:
        return self.notify("WATCHDOG=1")

    def status(self, text: str) -> bool:
        return self.notify(f"STATUS={text}")

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
