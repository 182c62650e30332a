"""The span, the finished-request log line and the end metrics of each request, read from
its ``RequestRecord``.

``observe`` wraps the pipeline of one request. It starts the request's server span (a child of
an incoming ``traceparent``, when there is one), hands out child spans for the pipeline's steps
(admission, streaming), and when the request is over ends the span (error status for a 5xx or
an engine failure), writes one log line, ``request finished``, with the fields ``log_fields``
gives (``docs/observability.md`` lists them), and counts the request (``count_end``). With
tracing off no span object is ever made.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from dataclasses import asdict
from typing import Any

from aiohttp import web
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, set_span_in_context

from tinyserve import protocol
from tinyserve.frontend.link.board_view import Limits, NodeLoad
from tinyserve.frontend.models.errors import ApiError
from tinyserve.frontend.request.admission import NeverFits, NotNow
from tinyserve.frontend.request.record import CLIENT_CLOSED, CLIENT_CLOSED_ERROR, RequestRecord
from tinyserve.frontend.request.state import TRACING
from tinyserve.logs import fields
from tinyserve.timeline_records import slot_ms
from tinyserve.tracing import extract, inject

log = logging.getLogger("tinyserve.requests")

CANCEL_CLIENT = "client_disconnect"  # the client went away before the end
CANCEL_ABORT = "frontend_abort"  # the frontend ended it (drain timeout, lost output)
# The status of a reply whose headers went out before its body was done (an event stream).
HEADERS_SENT = web.RequestKey("headers_sent", int)

_TRACE_HEADERS = ("traceparent", "tracestate")
# Endings that mark the request span with an error status even under a 200 (a stream's
# status is sent before its end is known).
FAILED_FINISHES = frozenset(
    {
        protocol.FINISH_ERROR,
        protocol.FINISH_TIMEOUT,
        protocol.FINISH_QUEUE_TIMEOUT,
        protocol.FINISH_DEADLINE_MISSED,
    }
)


def trace_context(record: RequestRecord) -> dict[str, str]:
    """The W3C context to send with the request so engine spans join its trace."""
    return inject(record.span) if record.span is not None else {}


@contextlib.contextmanager
def step(request: web.Request, record: RequestRecord, name: str) -> Iterator[None]:
    """A child span of the request's span around one step (nothing when tracing is off)."""
    tracer = request.app[TRACING].tracer
    if tracer is None or record.span is None:
        yield
        return
    with tracer.start_as_current_span(
        name, context=set_span_in_context(record.span), record_exception=False
    ) as span:
        try:
            yield
        except ApiError as exc:
            span.set_status(Status(StatusCode.ERROR, exc.reason or exc.type))
            raise


def status_when_gone(request: web.Request) -> int:
    """The status to record for ``request`` when its client went away: the one its headers
    carried if they went out (a stream cut short was still a 200), else ``CLIENT_CLOSED``."""
    sent: int = request.get(HEADERS_SENT, CLIENT_CLOSED)
    return sent


def admission_figures(
    record: RequestRecord, limits: Limits, load: NodeLoad, refusal: NeverFits | NotNow | None
) -> dict[str, Any]:
    """The admission decision and the board figures it was based on (sent with the request)."""
    return {
        "decision": "rejected" if refusal else "admitted",
        "reason": refusal.label if refusal else None,
        "ms": record.ms_since_arrival(),
        "n_ctx": limits.n_ctx,
        "max_queue": limits.max_queue,
        "slots": limits.slots,
        **asdict(load),
    }


def log_fields(record: RequestRecord, code: int | None) -> dict[str, Any]:
    """The ``request finished`` line's fields; ``code`` is the status sent, None when the
    client went away first."""
    finish = record.finish
    timeline = finish.timeline if finish is not None else None
    ttft = record.ttft_ns
    return {
        "request_id": record.request_id,
        "route": record.route,
        "tenant": record.generation.tenant,
        "priority": record.generation.priority,
        "status": record.status,
        "finish_reason": record.outcome(code),
        "error": record.error,
        "prompt_tokens": record.prompt_tokens,
        "cached_tokens": finish.cached_tokens if finish is not None else 0,
        # where the prompt came from: slot, host or disk tokens, and those computed
        **((timeline or {}).get("prompt_from") or {}),
        "generated_tokens": record.generated,
        "queue_ms": slot_ms(timeline),  # arrival to slot grant, from the engine's timeline
        "ttft_ms": round(ttft / 1e6, 3) if ttft is not None else None,
        "total_ms": record.ms_since_arrival(),
    }


@contextlib.contextmanager
def observe(request: web.Request, record: RequestRecord) -> Iterator[None]:
    """Span, log line and metrics of one request around the pipeline that serves it."""
    record.span = _start_span(request, record)
    try:
        yield
    except ApiError as exc:
        record.status, record.error = exc.status, exc.reason or exc.type
        raise
    except asyncio.CancelledError:
        record.status, record.error = status_when_gone(request), CLIENT_CLOSED_ERROR
        raise
    except Exception:
        record.status, record.error = 500, "internal_error"
        raise
    finally:
        code = None if record.status == CLIENT_CLOSED else record.status
        line = log_fields(record, code)
        log.info("request finished", extra=fields(**line))
        if record.span is not None:
            _end_span(record.span, line)
        count_end(record, code)


def count_end(record: RequestRecord, code: int | None) -> None:
    """The request is over: ``code`` is the HTTP status sent, None when none was."""
    metrics = record.metrics
    if metrics is None:
        return
    status = str(code if code is not None else CLIENT_CLOSED)
    metrics.requests_total.labels(record.outcome(code), status).inc()
    finish = record.replied_finish
    if finish is None:
        return
    metrics.request_duration_seconds.observe(record.ns_since_arrival() / 1e9)
    if finish.prompt_tokens:  # an end the engine reported (not one made up here)
        metrics.request_prompt_tokens.observe(finish.prompt_tokens)
        if record.generation.max_tokens:  # an embedding request generates nothing to count
            metrics.request_generation_tokens.observe(record.generated)


def count_cancel(record: RequestRecord) -> None:
    """The frontend asked the engine to stop this request (``record.cancel_reason``)."""
    reason, finish = record.cancel_reason, record.replied_finish
    if reason != protocol.FINISH_CANCELLED:
        label = reason  # the frontend's own cause (a client that stopped reading)
    elif finish is None:
        label = CANCEL_CLIENT
    elif record.engine_lost:
        return  # nothing to stop: the engine went away
    else:
        label = CANCEL_ABORT
    if record.metrics is not None:
        record.metrics.cancellations_total.labels(label).inc()


def _start_span(request: web.Request, record: RequestRecord) -> Span | None:
    tracer = request.app[TRACING].tracer
    if tracer is None:
        return None
    carrier = {h: request.headers[h] for h in _TRACE_HEADERS if h in request.headers}
    return tracer.start_span(
        f"{request.method} {record.route}",
        context=extract(carrier),
        kind=SpanKind.SERVER,
        attributes={"http.request.method": request.method, "url.path": request.path},
    )


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
