"""One frontend request, from arrival to outcome: the record every part of the frontend reads.

The pipeline makes it when a generation request arrives (minting the request id and taking the
one arrival stamp) and fills it in as the request goes (prompt length, admission figures, how
it ended). Its stream hands it each update the reply takes (``take``): the tokens are counted
here and nowhere else, and the first token's time and the gaps between tokens go to the
metrics from here. The request's span, its ``request finished`` log line and its end metrics
(``observe``) read it: one TTFT, from one start stamp.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from opentelemetry.trace import Span

from tinyserve import protocol
from tinyserve.frontend.link.streams import ENGINE_LOST
from tinyserve.frontend.models.usage import TokenCounts
from tinyserve.frontend.request.generation import Generation
from tinyserve.metrics import FrontendMetrics

# The error of a request whose client went away before its reply was done (log and span).
CLIENT_CLOSED_ERROR = "client_closed"
# The status recorded (never sent) for a client that closed before its reply: nginx's 499.
CLIENT_CLOSED = 499


def new_request_id() -> str:
    """The id of a new request: the only place one is made."""
    return uuid.uuid4().hex


@dataclass
class RequestRecord:
    """What the frontend knows about one request. ``finish`` is the update that ended it as
    the client was told: the one the reply took, or the engine's answer before acceptance."""

    route: str  # the route pattern, a bounded label
    generation: Generation  # sampling, tenant, priority as the engine gets them
    metrics: FrontendMetrics | None = None  # None: the request counts in no metric
    request_id: str = field(default_factory=new_request_id)
    arrival_ns: int = field(default_factory=time.monotonic_ns)
    prompt_tokens: int = 0
    prompt_ids: list[int] = field(default_factory=list)  # once tokenized
    admission: dict[str, Any] = field(default_factory=dict)
    replied: bool = False  # the engine accepted it and the surface's reply took over
    first_token_ns: int = 0  # when the reply took the first token; 0 before
    last_token_ns: int = 0
    token_gap_ns: int = 0  # between the last two updates that carried tokens
    generated: int = 0
    finish: protocol.RequestUpdate | None = None
    cancel_reason: str = ""  # why the frontend ended it, if it did (a cancel it sent, a stall)
    status: int = 200
    error: str | None = None
    span: Span | None = None  # the request's server span; None with tracing off

    @classmethod
    def of(
        cls,
        request: web.Request,
        generation: Generation,
        metrics: FrontendMetrics | None,
        request_id: str = "",
    ) -> RequestRecord:
        """The record of ``generation`` arriving now as ``request`` (with ``request_id`` when
        the caller minted it: choices of one call name each other)."""
        resource = request.match_info.route.resource
        route = resource.canonical if resource is not None else request.path
        if request_id:
            return cls(route, generation, metrics, request_id)
        return cls(route, generation, metrics)

    def take(self, update: protocol.RequestUpdate) -> None:
        """An update, as the reply takes it to write it out: its tokens counted and timed."""
        tokens = len(update.token_ids)
        if tokens:
            now = time.monotonic_ns()
            self.token_gap_ns = now - self.last_token_ns if self.last_token_ns else 0
            self.first_token_ns = self.first_token_ns or now
            self.last_token_ns = now
            self.generated += tokens
            if self.metrics is not None:
                self._time_tokens(tokens)
        if update.finish_reason is not None:
            self.finish = update

    def _time_tokens(self, tokens: int) -> None:
        assert self.metrics is not None
        if self.generated == tokens:
            ttft_s = (self.first_token_ns - self.arrival_ns) / 1e9
            self.metrics.time_to_first_token_seconds.observe(ttft_s)
            return
        # A slow reader gets several tokens in one update: share the gap among them.
        gap_s = self.token_gap_ns / 1e9 / tokens
        itl = self.metrics.inter_token_latency_seconds
        for _ in range(tokens):
            itl.observe(gap_s)

    def prompt_tokens_of(self, finish: protocol.RequestUpdate) -> int:
        """The prompt's length: the engine's figure, else our own count."""
        return finish.prompt_tokens or self.prompt_tokens

    def counts(self, end: protocol.RequestUpdate | None = None) -> TokenCounts:
        """What its reply's usage says, in every surface's words: the prompt's tokens, the
        tokens the reply took, those the prefix cache served; before ``end`` came (a stream
        that opens, or fails), our own prompt count and nothing cached."""
        if end is None:
            return TokenCounts(self.prompt_tokens, self.generated, 0)
        return TokenCounts(self.prompt_tokens_of(end), self.generated, end.cached_tokens)

    @property
    def replied_finish(self) -> protocol.RequestUpdate | None:
        """The end the reply took; None when it ended before or without one."""
        return self.finish if self.replied else None

    @property
    def engine_lost(self) -> bool:
        """The engine went away under the request (nothing left to cancel there)."""
        return self.finish is not None and self.finish.finish_reason == ENGINE_LOST

    def outcome(self, code: int | None) -> str:
        """How it ended, as its metrics and its log line name it: the end the reply took,
        else why the frontend ended it, else what ``code`` (the status sent; None when the
        client went away first) says of a request that ended before the engine accepted it."""
        finish = self.replied_finish
        if finish is not None:
            reason = finish.finish_reason
            assert reason is not None
            return protocol.FINISH_ERROR if reason == ENGINE_LOST else reason
        if self.cancel_reason:
            return self.cancel_reason
        if code is None or self.error == CLIENT_CLOSED_ERROR:  # a stream left midway too
            return protocol.FINISH_CANCELLED
        if code < 500 or code == 503:
            return protocol.FINISH_REJECTED  # bad input, admission, engine rejection, no engine
        return protocol.FINISH_ERROR

    @property
    def ttft_ns(self) -> int | None:
        """Arrival to the first token the reply took; None when none came."""
        return self.first_token_ns - self.arrival_ns if self.first_token_ns else None

    def ns_since_arrival(self, end_ns: int = 0) -> int:
        """Nanoseconds from arrival to ``end_ns`` (now by default)."""
        return (end_ns or time.monotonic_ns()) - self.arrival_ns

    def ms_since_arrival(self, end_ns: int = 0) -> float:
        """Milliseconds from arrival to ``end_ns`` (now by default), rounded to the microsecond."""
        return round(self.ns_since_arrival(end_ns) / 1e6, 3)
