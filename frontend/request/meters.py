"""A generation request's Prometheus figures.

``RequestMeter``: one per generation request, reading its ``RequestRecord`` (first token, gaps
between tokens, the cancel the pipeline sent, how it ended); ``observe`` tells it the status
sent. ``count_rejection``: a request the frontend's board check turned away.
"""

from __future__ import annotations

from tinyserve import protocol
from tinyserve.frontend.http.api_errors import CLIENT_CLOSED
from tinyserve.frontend.request.record import RequestRecord
from tinyserve.frontend.request.streams import Piece
from tinyserve.metrics import Metrics

STAGE = "frontend"
CANCEL_CLIENT = "client_disconnect"  # the client went away before the end
CANCEL_ABORT = "frontend_abort"  # the frontend ended it (drain timeout, lost output)


class RequestMeter:
    """Latencies and the outcome of one request, read from its record; ``end`` records them
    once."""

    def __init__(self, metrics: Metrics, record: RequestRecord) -> None:
        self._m = metrics
        self.record = record
        self._ended = False

    def took(self, piece: Piece) -> None:
        """The reply took ``piece`` (already in the record): its first token or token gaps."""
        rec = self.record
        if not piece.tokens:
            return
        if rec.generated == piece.tokens:
            ttft = rec.ttft_ns
            assert ttft is not None
            self._m.histogram("tinyserve_time_to_first_token_seconds").observe(ttft / 1e9)
            return
        # A slow reader gets several tokens in one piece: share the gap among them.
        gap = rec.token_gap_ns / 1e9 / piece.tokens
        itl = self._m.histogram("tinyserve_inter_token_latency_seconds")
        for _ in range(piece.tokens):
            itl.observe(gap)

    def cancel_sent(self) -> None:
        """The frontend asked the engine to stop this request (``record.cancel_reason``)."""
        reason, finish = self.record.cancel_reason, self.record.replied_finish
        if reason != protocol.FINISH_CANCELLED:
            label = reason  # the frontend's own cause (a client that stopped reading)
        elif finish is None:
            label = CANCEL_CLIENT
        elif finish.engine_down:
            return  # nothing to stop: the engine went away
        else:
            label = CANCEL_ABORT
        self._m.counter("tinyserve_cancellations_total").labels(label).inc()

    def end(self, code: int | None) -> None:
        """The request is over: ``code`` is the HTTP status sent, None when none was."""
        if self._ended:
            return
        self._ended = True
        rec = self.record
        status = str(code if code is not None else CLIENT_CLOSED)
        self._m.counter("tinyserve_requests_total").labels(rec.outcome(code), status).inc()
        finish = rec.replied_finish
        if finish is None:
            return
        duration = rec.ns_since_arrival() / 1e9
        self._m.histogram("tinyserve_request_duration_seconds").observe(duration)
        if finish.prompt_tokens:  # an end the engine reported (not one made up here)
            self._m.histogram("tinyserve_request_prompt_tokens").observe(finish.prompt_tokens)
            self._m.histogram("tinyserve_request_generation_tokens").observe(rec.generated)


def count_rejection(metrics: Metrics, reason: str) -> None:
    """A request the frontend's board check turned away."""
    metrics.counter("tinyserve_admission_rejections_total").labels(STAGE, reason).inc()
