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

from tinyserve.engine.timeline import NS_PER_MS, Timeline
from tinyserve.protocol import FINISH_ERROR, FINISH_QUEUE_TIMEOUT, FINISH_REJECTED, FINISH_TIMEOUT
from tinyserve.tracing import Tracing, extract

# Finish reasons that mark the span they ended with an error status.
FAILED = frozenset({FINISH_ERROR, FINISH_TIMEOUT, FINISH_QUEUE_TIMEOUT, FINISH_REJECTED})


class SpanRecorder:
    """Records the engine spans of finished requests with ``tracing``'s tracer."""

    def __init__(self, tracing: Tracing) -> None:
        assert tracing.tracer is not None
        self._tracer: Tracer = tracing.tracer
        self._wall = tracing.wall_ns
        self._request_id = ""

    def record(self, timeline: Timeline) -> None:
        assert timeline.finish is not None
        request = timeline.request
        # Without a traceparent (frontend tracing off) each span starts a trace of its own;
        # the request id attribute still ties them together.
        parent = extract(request.trace_context)
        self._request_id = request.request_id
        reason, detail, _, end_ns, generated = timeline.finish
        failed = reason in FAILED
        if timeline.accepted is None:
            self._span(parent, "engine.rejected", end_ns, end_ns, {"reason": detail}, detail)
            return
        slot_ns = timeline.slot[1] if timeline.slot else end_ns
        queue = {"policy": timeline.policy, "rule": timeline.slot[3] if timeline.slot else ""}
        queue_fails = failed and timeline.slot is None
        self._span(
            parent,
            "engine.queue_wait",
            timeline.accepted[1],
            slot_ns,
            queue,
            reason if queue_fails else None,
        )
        last = len(timeline.chunks) - 1
        for i, (tick, tokens, chunk_end, gap, decode_ns) in enumerate(timeline.chunks):
            fails = failed and i == last and not timeline.first_token_ns
            attributes = {"tick": tick, "tokens": tokens, "decode_ms": decode_ns / NS_PER_MS}
            self._span(
                parent,
                "engine.prefill_chunk",
                chunk_end - gap,
                chunk_end,
                attributes,
                reason if fails else None,
            )
        if timeline.first_token_ns:
            decode: dict[str, str | int | float] = {
                "ticks": sum(run[1] for run in timeline.decode_runs),
                "generated_tokens": generated,
                "finish_reason": reason,
            }
            self._span(
                parent,
                "engine.decode",
                timeline.first_token_ns,
                end_ns,
                decode,
                reason if failed else None,
            )

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
