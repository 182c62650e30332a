"""One frontend request, from arrival to outcome: the record every part of the frontend reads.

The pipeline makes it when a generation request arrives (minting the request id and taking the
one arrival stamp), fills it in as the request goes (prompt length, admission figures, output as
the reply takes it, how it ended), and the meter (``meters.RequestMeter``), the request's span
and its ``request finished`` log line (``observe``, which also keeps the request's span in it)
all read it: one TTFT, from one start stamp.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from opentelemetry.trace import Span

from tinyserve import protocol
from tinyserve.frontend.request.generation import Generation
from tinyserve.frontend.request.streams import Finish, Piece

# The error of a request whose client went away before its reply was done (log and span).
CLIENT_CLOSED_ERROR = "client_closed"


def new_request_id() -> str:
    """The id of a new request: the only place one is made."""
    return uuid.uuid4().hex


@dataclass
class RequestRecord:
    """What the frontend knows about one request. ``finish`` is how it ended as the client
    was told: the piece the reply took, or the engine's answer before acceptance."""

    route: str  # the route pattern, a bounded label
    generation: Generation  # sampling, tenant, priority as the engine gets them
    request_id: str = field(default_factory=new_request_id)
    arrival_ns: int = field(default_factory=time.monotonic_ns)
    prompt_tokens: int = 0
    prompt_ids: list[int] = field(default_factory=list)  # once tokenized
    admission: dict[str, Any] = field(default_factory=dict)
    replied: bool = False  # the engine accepted it and the surface's reply took over
    first_token_ns: int = 0  # when the reply took the first token; 0 before
    last_token_ns: int = 0
    token_gap_ns: int = 0  # between the last two pieces that carried tokens
    generated: int = 0
    finish: Finish | None = None
    cancel_reason: str = ""  # why the frontend ended it, if it did (a cancel it sent, a stall)
    status: int = 200
    error: str | None = None
    span: Span | None = None  # the request's server span; None with tracing off

    @classmethod
    def of(
        cls, request: web.Request, generation: Generation, request_id: str = ""
    ) -> RequestRecord:
        """The record of ``generation`` arriving now as ``request`` (with ``request_id`` when
        the caller minted it: choices of one call name each other)."""
        resource = request.match_info.route.resource
        route = resource.canonical if resource is not None else request.path
        if request_id:
            return cls(route, generation, request_id)
        return cls(route, generation)

    def take(self, piece: Piece) -> None:
        """A piece of output, as the reply takes it to write it out."""
        now = time.monotonic_ns()
        if piece.tokens:
            self.token_gap_ns = now - self.last_token_ns if self.last_token_ns else 0
            self.first_token_ns = self.first_token_ns or now
            self.last_token_ns = now
            self.generated += piece.tokens
        if piece.finish is not None:
            self.finish = piece.finish

    def prompt_tokens_of(self, finish: Finish) -> int:
        """The prompt's length: the engine's figure, else our own count."""
        return finish.prompt_tokens or self.prompt_tokens

    @property
    def replied_finish(self) -> Finish | None:
        """The end the reply took; None when it ended before or without one."""
        return self.finish if self.replied else None

    def outcome(self, code: int | None) -> str:
        """How it ended, as its metrics and its log line name it: the end the reply took,
        else why the frontend ended it, else what ``code`` (the status sent; None when the
        client went away first) says of a request that ended before the engine accepted it."""
        if self.replied_finish is not None:
            return self.replied_finish.reason
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
