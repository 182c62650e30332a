"""Turning a request's stream into the HTTP reply: one JSON object, or Server-Sent Events.

The machinery every API surface shares (``native.native_reply`` and ``openai.openai_reply``
build on it): ``collect`` for a whole output, ``write_sse`` for an event stream that always
ends, ``finish_error`` for the error a finish maps to, and the errors of an engine that is
away or turned the request down.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from aiohttp import web
from pydantic import BaseModel

from tinyserve import protocol
from tinyserve.frontend.http.api_errors import (
    ENGINE_ERROR,
    HEADERS_SENT,
    REASON_ENGINE_UNAVAILABLE,
    ApiError,
    too_long,
    unavailable,
)
from tinyserve.frontend.http.appkeys import CONFIG
from tinyserve.frontend.http.backpressure import ClientStalled, bound_buffers, paced_write
from tinyserve.frontend.models.common import to_json
from tinyserve.frontend.request import admission
from tinyserve.frontend.request.admission import Load, Rejection
from tinyserve.frontend.request.record import RequestRecord
from tinyserve.frontend.request.streams import Finish, RequestStream
from tinyserve.logs import fields

log = logging.getLogger(__name__)

SSE_HEADERS = {
    "Content-Type": "text/event-stream",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",  # nginx: pass each event on at once
}


# How a surface answers once the engine accepted a request: the pipeline hands it the stream
# and the request's record.
Reply = Callable[[web.Request, RequestStream, RequestRecord], Awaitable[web.StreamResponse]]
# The board's load now, for a Retry-After computed at reply time.
LoadNow = Callable[[], Load | None]


@dataclass
class Output:
    """A request's whole output, for a reply that is sent only once it is complete."""

    finish: Finish
    text: str = ""
    tokens: int = 0
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[list[Any]] = field(default_factory=list)
    prompt_logprobs: list[list[Any]] = field(default_factory=list)


class EventSource(Protocol):
    """One reply's server-sent events, as ``write_sse`` writes them."""

    def events(self) -> AsyncGenerator[bytes, None]:
        """Every event of the reply, its end included."""
        ...

    def failure_events(self) -> list[bytes]:
        """What ends the stream after a bug of ours; nothing when its end already went out."""
        ...


def rejection_error(rejection: Rejection, prompt_field: str = "prompt") -> ApiError:
    """The HTTP error for an admission (or engine) rejection; a 400 names ``prompt_field``,
    the request's field that is too long (``Generation.prompt_field``)."""
    if rejection.reason == admission.PROMPT_TOO_LONG:
        return ApiError(400, admission.PROMPT_TOO_LONG, rejection.message, param=prompt_field)
    if rejection.status == 400:
        return too_long(rejection.message, prompt_field)
    assert rejection.retry_after is not None
    return unavailable(rejection.reason, rejection.message, rejection.retry_after)


def engine_unavailable(detail: str = "engine unavailable") -> ApiError:
    """A 503 for requests that arrive, or are cut off, while no engine is serving."""
    return unavailable(REASON_ENGINE_UNAVAILABLE, detail, admission.ENGINE_DOWN_RETRY_S)


def finish_error(
    finish: Finish, load: Load | None, prompt_field: str = "prompt"
) -> ApiError | None:
    """The HTTP error a finish maps to (rejected, error), or None for a normal ending;
    ``prompt_field`` as ``rejection_error`` takes it."""
    if finish.reason == protocol.FINISH_REJECTED:
        rejection = admission.engine_rejection(finish.detail, load or admission.IDLE_LOAD)
        return rejection_error(rejection, prompt_field)
    if finish.reason != protocol.FINISH_ERROR:
        return None
    if finish.engine_down:
        return engine_unavailable(finish.detail)
    return ApiError(500, ENGINE_ERROR, finish.detail or "engine error")


async def collect(stream: RequestStream) -> Output:
    """Wait for the whole output of ``stream``."""
    parts: list[str] = []
    tokens = 0
    token_ids: list[int] = []
    logprobs: list[list[Any]] = []
    prompt_logprobs: list[list[Any]] = []
    finish: Finish | None = None
    async for piece in stream.pieces():
        parts.append(piece.text)
        tokens += piece.tokens
        token_ids += piece.token_ids
        logprobs += piece.logprobs
        prompt_logprobs += piece.prompt_logprobs
        finish = piece.finish
    assert finish is not None
    return Output(finish, "".join(parts), tokens, token_ids, logprobs, prompt_logprobs)


async def write_sse(
    request: web.Request, request_id: str, source: EventSource
) -> web.StreamResponse:
    """Send ``source``'s events as they come; a stream always ends, even after a bug of ours."""
    response = web.StreamResponse(headers={**SSE_HEADERS, "X-Request-Id": request_id})
    await response.prepare(request)
    request[HEADERS_SENT] = response.status
    bound_buffers(request)
    timeout_s = request.app[CONFIG].write_timeout
    try:
        async with contextlib.aclosing(source.events()) as events:
            async for event in events:
                await paced_write(request, response, event, timeout_s)
        await response.write_eof()
    except ClientStalled:
        raise  # the pipeline cancels the request and drops the connection
    except ConnectionResetError:
        # The client is gone; the handler's cleanup cancels the request in the engine.
        log.info("client went away mid-stream", extra=fields(request_id=request_id))
    except Exception:
        # A bug of ours after the headers went out: still end the stream the way the API says.
        log.exception("stream failed", extra=fields(request_id=request_id))
        with contextlib.suppress(ConnectionResetError):
            for event in source.failure_events():
                await response.write(event)
            await response.write_eof()
    return response


def sse_event(data: BaseModel | str) -> bytes:
    """One ``data:`` event; a string goes out as it is (``[DONE]``, or JSON already made)."""
    payload = data if isinstance(data, str) else to_json(data)
    return b"data: " + payload.encode("utf-8") + b"\n\n"
