"""Engine spans of one request, made from its finished timeline.

The engine loop never holds a span open: when a request finishes, its timeline already has
every stamp, so the spans (queue wait, each prefill chunk, decode) are created afterwards with
explicit start and end times, as children of the frontend's request span whose W3C context
came inside the ``Submit``. Nothing here runs when tracing is off.
"""

from __future__ import annotations

from collections.abc import Mapping

from opentelemetry.context import Context
from opentelemetry.trace import SpanKind, Status, StatusCode, Tracer

from tinyserve.engine.request.timeline import Timeline
from tinyserve.protocol import (
    FINISH_DEADLINE_MISSED,
    FINISH_ERROR,
    FINISH_QUEUE_TIMEOUT,
    FINISH_REJECTED,
    FINISH_TIMEOUT,
)
from tinyserve.timeline_records import NS_PER_MS
from tinyserve.tracing import Tracing, extract

# Finish reasons that mark the span they ended with an error status.
FAILED = frozenset(
    {FINISH_ERROR, FINISH_TIMEOUT, FINISH_QUEUE_TIMEOUT, FINISH_REJECTED, FINISH_DEADLINE_MISSED}
)


class SpanRecorder:
    """Records the engine spans of finished requests with ``tracing``'s tracer."""

    def __init__(self, tracing: Tracing) -> None:
        assert tracing.tracer is not None
        self._tracer: Tracer = tracing.tracer
        self._wall = tracing.wall_ns
        self._request_id = ""

    def record(self, timeline: Timeline) -> None:
        finish = timeline.finish
        assert finish is not None
        request = timeline.request
        # Without a traceparent (frontend tracing off) each span starts a trace of its own;
        # the request id attribute still ties them together.
        parent = extract(request.trace_context)
        self._request_id = request.request_id
        failed = finish.reason in FAILED
        error = finish.reason if failed else None
        if timeline.accepted is None:
            detail = finish.detail
            self._span(parent, "engine.rejected", finish.ns, finish.ns, {"reason": detail}, detail)
            return
        slot = timeline.slot
        queue = {"policy": timeline.policy, "rule": slot.rule if slot else ""}
        slot_ns = slot.ns if slot else finish.ns
        queue_error = error if slot is None else None
        self._span(parent, "engine.queue_wait", timeline.accepted.ns, slot_ns, queue, queue_error)
        last = len(timeline.chunks) - 1
        for i, chunk in enumerate(timeline.chunks):
            fails = failed and i == last and not timeline.first_token_ns
            attributes = {
                "tick": chunk.tick,
                "tokens": chunk.tokens,
                "decode_ms": chunk.decode_ns / NS_PER_MS,
            }
            self._span(
                parent,
                "engine.prefill_chunk",
                chunk.start_ns,
                chunk.end_ns,
                attributes,
                error if fails else None,
            )
        if timeline.first_token_ns:
            decode: dict[str, str | int | float] = {
                "ticks": sum(run.ticks for run in timeline.decode_runs),
                "generated_tokens": finish.generated,
                "finish_reason": finish.reason,
            }
            self._span(parent, "engine.decode", timeline.first_token_ns, finish.ns, decode, error)

    def _span(
        self,
        parent: Context,
        name: str,
        start_ns: int,
        end_ns: int,
        attributes: Mapping[str, str | int | float],
        error: str | None,
    ) -> None:
        span = self._tracer.start_span(
            name,
            context=parent,
            kind=SpanKind.INTERNAL,
            attributes={
                "tinyserve.request_id": self._request_id,
                **{f"tinyserve.{k}": v for k, v in attributes.items()},
            },
            start_time=self._wall(start_ns),
        )
        if error is not None:
            span.set_status(Status(StatusCode.ERROR, error))
        span.end(end_time=self._wall(end_ns))
