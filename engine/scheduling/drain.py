"""How fast requests leave the engine: the board's ``drain_rate``, from which the frontends
compute a 503's ``Retry-After`` (``frontend/request/admission.py``).

Counted on a clock that runs only while requests run: the requests that finished over the
last ``WINDOW_S`` seconds of work, per second of work. Idle time neither dilutes the rate nor
ages it out, so a burst that follows a quiet spell is told how fast the engine drained when
it last had work; a wall-clock window would have emptied, and every refused client been told
the frontends' prior instead (with a long queue ahead, the 60 s cap). With no finish in the
window (the first requests since the engine started, or requests longer than the window),
the running requests' own pace stands in: each leaves after the steps it has left (prompt
chunks and tokens up to its ``max_tokens``, one each), at the recent time per step. With
fewer finishes than slots in the window (not yet one wave of them), the larger of the two
counts: one early finish over a second of work would otherwise read as a rate of one a
second, and a queue of 64 ahead as the 60 s cap (``bench/retry_after.py``).
"""

from __future__ import annotations

import math
from collections import deque

from tinyserve.engine.request.sequence import Sequence

WINDOW_S = 10.0
MIN_SPAN_S = 1.0  # a first finish moments into the work is not a rate of hundreds a second
STEP_WEIGHT = 0.2  # of the newest step in the running time per step


class DrainRate:
    """The engine's drain rate: told when each step starts and when a request finishes."""

    def __init__(self, chunk: int, slots: int) -> None:
        self._chunk = chunk  # prompt tokens a step prefills per sequence, at most
        self._slots = slots
        self._busy_ns = 0  # the clock of work
        self._last_step_ns: int | None = None
        self._step_s = 0.0  # recent seconds per step while requests run
        self._finished: deque[int] = deque()  # on the clock of work

    def step(self, now_ns: int, running: bool) -> None:
        """A step starts at ``now_ns``; ``running``: requests ran since the last one started."""
        if running and self._last_step_ns is not None:
            elapsed_ns = now_ns - self._last_step_ns
            self._busy_ns += elapsed_ns
            elapsed_s = elapsed_ns / 1e9
            if self._step_s:
                self._step_s += STEP_WEIGHT * (elapsed_s - self._step_s)
            else:
                self._step_s = elapsed_s
        self._last_step_ns = now_ns

    def finished(self) -> None:
        """A request left (ended in any way: it gave its slot and blocks back)."""
        self._finished.append(self._busy_ns)

    def rate(self, running: list[Sequence]) -> float:
        """Requests per second; 0 when nothing is known (no finish, nothing running)."""
        horizon = self._busy_ns - int(WINDOW_S * 1e9)
        while self._finished and self._finished[0] < horizon:
            self._finished.popleft()
        span_s = min(WINDOW_S, max(self._busy_ns / 1e9, MIN_SPAN_S))
        measured = len(self._finished) / span_s
        if len(self._finished) >= self._slots:
            return measured
        return max(measured, self._pace(running))

    def _pace(self, running: list[Sequence]) -> float:
        if not running or not self._step_s:
            return 0.0
        steps = sum(self._steps_left(seq) for seq in running) / len(running)
        return len(running) / (max(steps, 1.0) * self._step_s)

    def _steps_left(self, seq: Sequence) -> int:
        prefill = math.ceil(seq.prefill_left / self._chunk)
        return prefill + max(seq.request.max_tokens - seq.generated, 0)
