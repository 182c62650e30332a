"""What the frontend records about each request it serves: spans and the finished-request log.

``observe`` wraps the pipeline of one request. It starts the request's server span (a child of
an incoming ``traceparent``, when there is one), hands out child spans for the pipeline's steps
(admission, streaming), and when the request is over ends the span (error status for a 5xx or
an engine failure), writes one log line, ``request finished``, with the fields ``LOG_FIELDS``
lists, and tells ``on_end`` (the request's meter) the status. With tracing off no span object
is ever made.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from aiohttp import web
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, set_span_in_context

from tinyserve import protocol
from tinyserve.frontend.admission import Limits, Load, Rejection
from tinyserve.frontend.api_errors import CLIENT_CLOSED, ApiError
from tinyserve.frontend.generation import Generation
from tinyserve.frontend.keys import TRACING
from tinyserve.frontend.streams import RequestStream
from tinyserve.logs import fields
from tinyserve.timeline_records import slot_ms
from tinyserve.tracing import extract, inject

log = logging.getLogger("tinyserve.requests")

CLIENT_CLOSED_ERROR = "client_closed"
LOG_FIELDS = (
    "request_id", "route", "tenant", "priority", "status", "finish_reason", "error",
    "prompt_tokens", "cached_tokens", "generated_tokens", "queue_ms", "ttft_ms", "total_ms",
)  # fmt: skip
_TRACE_HEADERS = ("traceparent", "tracestate")
# Endings that mark the request span with an error status even under a 200 (a stream's
# status is sent before its end is known).
FAILED_FINISHES = frozenset(
    {protocol.FINISH_ERROR, protocol.FINISH_TIMEOUT, protocol.FINISH_QUEUE_TIMEOUT}
)


@dataclass
class Observation:
    """One request as the frontend saw it; filled in by the pipeline as it goes."""

    request_id: str
    route: str
    arrival_ns: int
    span: Span | None = None
    prompt_tokens: int = 0
    admission: dict[str, Any] = field(default_factory=dict)
    stream: RequestStream | None = None
    status: int = 200
    error: str | None = None

    @property
    def trace_context(self) -> dict[str, str]:
        """The W3C context to send with the request so engine spans join this trace."""
        return inject(self.span) if self.span is not None else {}

    @contextlib.contextmanager
    def step(self, request: web.Request, name: str) -> Iterator[None]:
        """A child span of the request span around one step (nothing when tracing is off)."""
        tracer = request.app[TRACING].tracer
        if tracer is None or self.span is None:
            yield
            return
        with tracer.start_as_current_span(
            name, context=set_span_in_context(self.span), record_exception=False
        ) as span:
            try:
                yield
            except ApiError as exc:
                span.set_status(Status(StatusCode.ERROR, exc.reason or exc.type))
                raise

    def admitted(
        self, limits: Limits, load: Load, blocks: int, rejection: Rejection | None
    ) -> None:
        """Record the admission decision and the board figures it was based on."""
        self.admission = {
            "decision": "rejected" if rejection else "admitted",
            "reason": rejection.reason if rejection else None,
            "ms": _since(self.arrival_ns),
            "blocks_needed": blocks,
            "blocks_total": limits.blocks_total,
            "max_queue": limits.max_queue,
            "slots": limits.slots,
            **asdict(load),
        }

    def log_fields(self, req: Generation) -> dict[str, Any]:
        """The ``request finished`` line's fields (``LOG_FIELDS``)."""
        stream = self.stream
        finish = stream.finish if stream is not None else None
        timeline = finish.timeline if finish is not None else None
        first = stream.first_token_ns if stream is not None else 0
        return {
            "request_id": self.request_id,
            "route": self.route,
            "tenant": req.tenant,
            "priority": req.priority,
            "status": self.status,
            "finish_reason": finish.reason if finish is not None else None,
            "error": self.error,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": finish.cached_tokens if finish is not None else 0,
            "generated_tokens": stream.generated if stream is not None else 0,
            "queue_ms": slot_ms(timeline),  # arrival to slot grant, from the engine's timeline
            "ttft_ms": _since(self.arrival_ns, first) if first else None,
            "total_ms": _since(self.arrival_ns),
        }


@contextlib.contextmanager
def observe(
    request: web.Request, req: Generation, on_end: Callable[[int | None], None]
) -> Iterator[Observation]:
    """Span and log line of one request around the pipeline that serves it; ``on_end`` gets
    the HTTP status sent, or None when the client went away first."""
    route = request.match_info.route.resource
    obs = Observation(
        uuid.uuid4().hex,
        route.canonical if route is not None else request.path,
        time.monotonic_ns(),
    )
    tracer = request.app[TRACING].tracer
    if tracer is not None:
        carrier = {h: request.headers[h] for h in _TRACE_HEADERS if h in request.headers}
        obs.span = tracer.start_span(
            f"{request.method} {obs.route}",
            context=extract(carrier),
            kind=SpanKind.SERVER,
            attributes={"http.request.method": request.method, "url.path": request.path},
        )
    try:
        yield obs
    except ApiError as exc:
        obs.status, obs.error = exc.status, exc.reason or exc.type
        raise
    except asyncio.CancelledError:
        obs.status, obs.error = CLIENT_CLOSED, CLIENT_CLOSED_ERROR
        raise
    except Exception:
        obs.status, obs.error = 500, "internal_error"
        raise
    finally:
        line = obs.log_fields(req)
        log.info("request finished", extra=fields(**line))
        if obs.span is not None:
            _end_span(obs.span, line)
        on_end(None if obs.error == CLIENT_CLOSED_ERROR else obs.status)


def _end_span(span: Span, line: dict[str, Any]) -> None:
    for key in ("request_id", "tenant", "priority", "prompt_tokens", "cached_tokens",
                "generated_tokens", "finish_reason"):  # fmt: skip
        if line[key] is not None:
            span.set_attribute(f"tinyserve.{key}", line[key])
    span.set_attribute("http.response.status_code", line["status"])
    failed = line["status"] >= 500 or line["finish_reason"] in FAILED_FINISHES
    if failed:
        span.set_status(Status(StatusCode.ERROR, line["error"] or line["finish_reason"] or ""))
    span.end()


def _since(start_ns: int, end_ns: int = 0) -> float:
    return round(((end_ns or time.monotonic_ns()) - start_ns) / 1e6, 3)
