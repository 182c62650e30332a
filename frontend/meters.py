"""The frontend's Prometheus figures and ``GET /metrics``.

- ``RequestMeter``: one per generation request, reading its ``RequestRecord`` (first token,
  gaps between tokens, the cancel the pipeline sent, how it ended); ``observe`` tells it the
  status sent.
- ``LinkMeter``: engine up/down as this frontend sees the board heartbeat, its open streams,
  and marking a lost engine's process dead so its gauges stop showing.
- ``GET /metrics``: every process's metrics of this node, merged (text exposition format).
"""

from __future__ import annotations

import asyncio

from aiohttp import web
from aiohttp.typedefs import Middleware

from tinyserve import protocol
from tinyserve.frontend.api_errors import CLIENT_CLOSED, Handler
from tinyserve.frontend.record import RequestRecord
from tinyserve.frontend.streams import Piece
from tinyserve.metrics import CONTENT_TYPE, Metrics
from tinyserve.procs import pid_alive

METRICS = web.AppKey("metrics", Metrics)

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
        finish = rec.replied_finish
        status = str(code if code is not None else CLIENT_CLOSED)
        if finish is None:
            reason = rec.cancel_reason or _reason_without_finish(code)
            self._m.counter("tinyserve_requests_total").labels(reason, status).inc()
            return
        self._m.counter("tinyserve_requests_total").labels(finish.reason, status).inc()
        duration = rec.ns_since_arrival() / 1e9
        self._m.histogram("tinyserve_request_duration_seconds").observe(duration)
        if finish.prompt_tokens:  # an end the engine reported (not one made up here)
            self._m.histogram("tinyserve_request_prompt_tokens").observe(finish.prompt_tokens)
            self._m.histogram("tinyserve_request_generation_tokens").observe(rec.generated)


def _reason_without_finish(code: int | None) -> str:
    """The outcome of a request that ended before the engine accepted it."""
    if code is None:
        return protocol.FINISH_CANCELLED  # the client went away
    if code < 500 or code == 503:
        return protocol.FINISH_REJECTED  # bad input, admission, engine rejection, no engine
    return protocol.FINISH_ERROR


UNMATCHED_ROUTE = "unmatched"  # no route (404) or none for the method (405): a bounded label


def http_middleware(metrics: Metrics) -> Middleware:
    """Count every response by route pattern and status: what the pipeline never sees too
    (401, 413, 415, unparsable bodies, drain and busy 503s, 404s)."""
    responses = metrics.counter("tinyserve_http_responses_total")

    @web.middleware
    async def count_response(request: web.Request, handler: Handler) -> web.StreamResponse:
        resource = request.match_info.route.resource
        route = resource.canonical if resource is not None else UNMATCHED_ROUTE
        code = CLIENT_CLOSED
        try:
            response = await handler(request)
            code = response.status
            return response
        except web.HTTPException as exc:  # answered by aiohttp itself (e.g. 405)
            code = exc.status
            raise
        finally:
            responses.labels(route, str(code)).inc()

    return count_response


def count_rejection(metrics: Metrics, reason: str) -> None:
    """A request the frontend's board check turned away."""
    metrics.counter("tinyserve_admission_rejections_total").labels(STAGE, reason).inc()


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


async def metrics_handler(request: web.Request) -> web.Response:
    """The node's metrics: engine and every frontend, merged from their files."""
    # Reading every process's files takes milliseconds: off the event loop, between streams.
    body = await asyncio.to_thread(request.app[METRICS].render)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


def add_metrics_route(app: web.Application) -> None:
    """Register ``GET /metrics`` on ``app``."""
    app.router.add_get("/metrics", metrics_handler)
