"""Turning a request's stream into the HTTP reply: one JSON object, or Server-Sent Events.

The machinery every API surface shares (``native.native_reply``, ``openai.openai_reply`` and
the replies of the surfaces translated into chat build on it): ``collect`` for a whole
output, ``write_sse`` for an event stream that always ends and is kept alive while it has
nothing to say, ``progress_of`` for the prefill progress a request asked for,
``finish_error`` for the error a finish maps to, and the errors of an engine that is away or
turned the request down.
"""

from __future__ import annotations

import asyncio
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
from tinyserve.frontend.models.progress import PromptProgress
from tinyserve.frontend.request import admission
from tinyserve.frontend.request.admission import Load, Rejection
from tinyserve.frontend.request.record import RequestRecord
from tinyserve.frontend.request.streams import Finish, Piece, RequestStream
from tinyserve.logs import fields

log = logging.getLogger(__name__)

# An SSE comment: what a stream sends while it has nothing to say (a long prefill, a queue, a
# tool call held back), so that proxies and clients that give up on a silent connection do not.
# Every SSE client skips comments.
KEEPALIVE = b": keep-alive\n\n"
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
    request: web.Request, request_id: str, source: EventSource, keepalive: bytes = KEEPALIVE
) -> web.StreamResponse:
    """Send ``source``'s events as they come, and ``keepalive`` after every
    ``--sse-ping-interval`` seconds without one; a stream always ends, even after a bug of
    ours."""
    response = web.StreamResponse(headers={**SSE_HEADERS, "X-Request-Id": request_id})
    await response.prepare(request)
    request[HEADERS_SENT] = response.status
    bound_buffers(request)
    config = request.app[CONFIG]
    timeout_s, every_s = config.write_timeout, config.sse_ping_interval
    try:
        async with (
            contextlib.aclosing(source.events()) as events,
            contextlib.aclosing(kept_alive(events, every_s, keepalive)) as kept,
        ):
            async for event in kept:
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


async def kept_alive(
    events: AsyncGenerator[bytes, None], every_s: float, keepalive: bytes
) -> AsyncGenerator[bytes, None]:
    """``events``, with ``keepalive`` in between whenever the next one takes longer than
    ``every_s`` seconds (0: never). Each event is awaited in a task of its own, so that the
    wait can end without cancelling the generator (~13 us per event, measured)."""
    if not every_s:
        async for event in events:
            yield event
        return
    while True:
        step = asyncio.ensure_future(anext(events))
        try:
            while not (await asyncio.wait({step}, timeout=every_s))[0]:
                yield keepalive
        finally:
            if not step.done():  # the stream's writer failed, or the handler was cancelled
                step.cancel()
                with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                    await step
        try:
            event = step.result()
        except StopAsyncIteration:
            return
        yield event


def progress_of(record: RequestRecord, piece: Piece) -> PromptProgress | None:
    """The prefill progress ``piece`` reports, when its request asked for progress."""
    if not (piece.prompt_done and record.generation.return_progress):
        return None
    return PromptProgress(
        total=record.prompt_tokens,
        cache=piece.prompt_cached,
        processed=piece.prompt_done,
        time_ms=record.ms_since_arrival(),
    )


def sse_event(data: BaseModel | str, name: str = "") -> bytes:
    """One ``data:`` event, named by an ``event:`` line when ``name`` is given (Anthropic's and
    the Responses API's streams); a string goes out as it is (``[DONE]``, or JSON already
    made)."""
    payload = data if isinstance(data, str) else to_json(data)
    head = f"event: {name}\n".encode() if name else b""
    return head + b"data: " + payload.encode("utf-8") + b"\n\n"
