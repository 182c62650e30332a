"""OpenTelemetry set-up shared by the engine and the frontends (``--trace-exporter``).

``none`` (the default) builds no SDK provider at all: ``Tracing.tracer`` is None and the
code paths that make spans are skipped, so tracing costs nothing when it is off. ``console``
prints finished spans to stdout; ``otlp`` sends them with the OTLP/HTTP exporter, an
optional dependency (``pip install 'tinyserve[otlp]'``), configured by the exporter's own
``OTEL_EXPORTER_OTLP_*`` environment variables. One trace per request crosses the ZMQ hop as a
W3C ``traceparent`` carried in ``Submit.trace_context``.
"""

from __future__ import annotations

import logging
import time

from opentelemetry.context import Context
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SpanExporter,
)
from opentelemetry.trace import Span, Tracer, set_span_in_context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from tinyserve.config import Config
from tinyserve.errors import TinyServeError

log = logging.getLogger(__name__)

INSTRUMENTATION = "tinyserve"
OTLP_EXTRA = "pip install 'tinyserve[otlp]'"
_PROPAGATOR = TraceContextTextMapPropagator()


class Tracing:
    """This process's tracer (None when tracing is off) and what flushes it at exit."""

    def __init__(self, provider: TracerProvider | None = None) -> None:
        self.provider = provider
        self.tracer: Tracer | None = provider.get_tracer(INSTRUMENTATION) if provider else None
        # OpenTelemetry stamps spans in wall-clock ns; our stamps are CLOCK_MONOTONIC.
        self.wall_offset_ns = wall_offset_ns()

    @classmethod
    def with_processor(cls, processor: SpanProcessor, service: str) -> Tracing:
        """Tracing that hands every finished span to ``processor`` (tests: an in-memory one)."""
        provider = TracerProvider(resource=Resource.create({SERVICE_NAME: service}))
        provider.add_span_processor(processor)
        return cls(provider)

    def wall_ns(self, monotonic_ns: int) -> int:
        """A ``time.monotonic_ns()`` stamp as the wall-clock time spans are stamped in."""
        return monotonic_ns + self.wall_offset_ns

    def shutdown(self) -> None:
        """Export what is still buffered; called once when the process stops."""
        if self.provider is not None:
            self.provider.shutdown()


def wall_offset_ns(samples: int = 16) -> int:
    """Wall-clock minus monotonic time, read between the closest of ``samples`` pairs of
    monotonic reads: a preemption between two bare reads would shift every engine span by
    as long as it lasted, ahead of the frontend span it belongs under."""
    best_gap, best_offset = None, 0
    for _ in range(samples):
        before = time.monotonic_ns()
        wall = time.time_ns()
        after = time.monotonic_ns()
        if best_gap is None or after - before < best_gap:
            best_gap, best_offset = after - before, wall - (before + after) // 2
    return best_offset


def from_config(config: Config, process_name: str) -> Tracing:
    """The tracing ``--trace-exporter`` asks for; a clear error when otlp is not installed."""
    if config.trace_exporter == "none":
        return Tracing()
    exporter = _console() if config.trace_exporter == "console" else _otlp()
    log.info("tracing on", extra={"fields": {"exporter": config.trace_exporter}})
    return Tracing.with_processor(BatchSpanProcessor(exporter), f"tinyserve-{process_name}")


def _console() -> SpanExporter:
    return ConsoleSpanExporter()


def _otlp() -> SpanExporter:
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError as exc:
        raise TinyServeError(
            f"--trace-exporter otlp needs the OTLP exporter package: {OTLP_EXTRA}"
        ) from exc
    exporter: SpanExporter = OTLPSpanExporter()
    return exporter


def inject(span: Span) -> dict[str, str]:
    """The W3C trace context (``traceparent``) of ``span``, for a message to another process."""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, set_span_in_context(span))
    return carrier


def extract(carrier: dict[str, str]) -> Context:
    """The parent context a ``traceparent`` (from a header or a message) names, if any."""
    return _PROPAGATOR.extract(carrier)
