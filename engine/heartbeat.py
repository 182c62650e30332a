"""The board's heartbeat, written from a thread of its own while the engine loop progresses."""

from __future__ import annotations

import threading
import time

from tinyserve_native.board import Board


class HeartbeatThread(threading.Thread):
    """Writes the board heartbeat every 100 ms while the engine loop keeps making progress.

    A separate thread because one decode call can take longer than the frontends' 1 s
    liveness limit; the loop's own progress stamp still lets a hung loop go silent.
    """

    def __init__(self, board: Board, stall_limit_s: float = 30.0) -> None:
        super().__init__(name="heartbeat", daemon=True)
        self._board = board
        self._stall_ns = int(stall_limit_s * 1e9)
        self._halt = threading.Event()
        self.progress_ns = time.monotonic_ns()

    def run(self) -> None:
        while not self._halt.wait(0.1):
            now = time.monotonic_ns()
            if now - self.progress_ns < self._stall_ns:
                self._board.heartbeat(now)

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=1.0)
