"""The engine link's Prometheus figures: engine up/down as this frontend sees the board
heartbeat, its open streams, and marking a lost engine's process dead so its gauges stop
showing."""

from __future__ import annotations

from tinyserve.metrics import Metrics
from tinyserve.procs import pid_alive


class LinkMeter:
    """What the engine link reports: engine up (this process's view) and open streams."""

    def __init__(self, metrics: Metrics) -> None:
        self._m = metrics
        self._up = metrics.gauge("tinyserve_engine_up")
        self._in_flight = metrics.gauge("tinyserve_frontend_requests_in_flight")
        self._up.set(0)
        self._in_flight.set(0)

    def serving(self, in_flight: int) -> None:
        self._up.set(1)
        self._in_flight.set(in_flight)

    def lost(self, engine_pid: int | None) -> None:
        """The engine is down for us; a dead engine's live gauges go (counters stay)."""
        self._up.set(0)
        self._in_flight.set(0)
        if engine_pid and not pid_alive(engine_pid):
            self._m.forget_process(engine_pid)
