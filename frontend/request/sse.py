"""A reply's output: one JSON object (``collect``), or server-sent events (``write_sse``).

``write_sse`` is the one loop every surface's stream goes through: it takes each update of
the request's stream, asks the surface's ``Events`` what it makes of it, and writes that out.
When the stream has been quiet for ``--sse-ping-interval`` seconds (a long prefill, a queue,
a tool call held back) it writes the surface's keep-alive instead, so that proxies and clients
that give up on a silent connection do not; the stream's own timer says when (``Inbox``).

Slow readers cost bounded memory. Their stream merges pending updates into one, and the bytes
on their way sit in small buffers: the socket's send buffer is capped at ``STREAM_SNDBUF``
(Linux doubles it; autotuning could otherwise let one stalled connection pin megabytes of
kernel memory), and after each write ``paced_write`` waits until the transport has handed its
buffer down to ``STREAM_BUFFER_LOW`` bytes, so aiohttp's own 64 KiB of slack is never used;
meanwhile new output merges. A reader that takes nothing for ``--write-timeout`` seconds (the
buffer does not shrink at all) is stalled: ``ClientStalled`` is raised, the request is
cancelled in the engine (reason ``client_stalled``) and the connection dropped. One that
takes anything keeps its stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
from collections.abc import Awaitable, Callable
from typing import Protocol

from aiohttp import web
from pydantic import BaseModel

from tinyserve.frontend.link.board_view import NodeLoad
from tinyserve.frontend.link.streams import RequestStream
from tinyserve.frontend.models.common import to_json
from tinyserve.frontend.models.progress import PromptProgress
from tinyserve.frontend.request.observe import HEADERS_SENT
from tinyserve.frontend.request.record import RequestRecord
from tinyserve.frontend.request.state import CONFIG
from tinyserve.logs import fields
from tinyserve.protocol import RequestUpdate

log = logging.getLogger(__name__)

# An SSE comment: every SSE client skips it.
KEEPALIVE = b": keep-alive\n\n"
SSE_HEADERS = {
    "Content-Type": "text/event-stream",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",  # nginx: pass each event on at once
}
# A token stream needs a few KB/s; 16 KiB (32 KiB once the kernel doubles it) still carries
# over 150 KB/s at a 200 ms round trip.
STREAM_SNDBUF = 16 * 1024
STREAM_BUFFER_HIGH = 16 * 1024  # the transport pauses aiohttp's writer above this
STREAM_BUFFER_LOW = 4 * 1024  # ... and resumes it at or below this
# Written at most this much at a time (room for chunked encoding's few bytes), a write after
# the wait never lifts the buffer above the high mark, so aiohttp never blocks on its own.
SLICE = STREAM_BUFFER_HIGH - STREAM_BUFFER_LOW - 256
LAG_POLL_S = 0.02  # how often a waiting writer looks at the buffer (only while it lags)


class Updates(Protocol):
    """Where a stream's updates come from: one request's ``RequestStream``, or the inbox of
    several choices (``openai.choices``)."""

    async def next(self, quiet_s: float = 0.0) -> RequestUpdate | None: ...

    def close(self) -> None: ...


class Events(Protocol):
    """What a surface makes of a stream: the events ``write_sse`` writes."""

    @property
    def ended(self) -> bool:
        """Its end went out: nothing more to write."""
        ...

    def opening(self) -> list[bytes]:
        """What the stream starts with."""
        ...

    async def take(self, update: RequestUpdate) -> list[bytes]:
        """The events of one update (its end among them, when it carries the finish)."""
        ...

    def failure_events(self) -> list[bytes]:
        """What ends the stream after a bug of ours; nothing when its end already went out."""
        ...


# What the pipeline hands an accepted request's stream to: a surface's ``Answer`` as the
# pipeline makes it one (``pipeline.run``), or a choice of several (``openai.choices``).
Reply = Callable[[web.Request, RequestStream, RequestRecord], Awaitable[web.StreamResponse]]


class Answer(Protocol):
    """How a surface answers once the engine accepted a request. The pipeline decides which
    of the two a request gets (its ``stream``): the events of a stream (``write_sse`` writes
    them, and ``keepalive`` while the stream is quiet), or the whole reply of an ending that is
    not an error (the pipeline collects the output and raises an error's ending, which the
    error middleware answers in the path's shape)."""

    keepalive: bytes
    # A request that timed out waiting for a slot is a 503 (no token was made), rather than
    # an ending the reply reports.
    queue_timeout_refused: bool

    def events(self, record: RequestRecord, load: Callable[[], NodeLoad | None]) -> Events:
        """The events of the request's stream."""
        ...

    async def whole(self, record: RequestRecord, whole: RequestUpdate) -> web.Response:
        """The whole reply to the request's output ``whole``."""
        ...


class ClientStalled(Exception):
    """The client took nothing for the write timeout. The response was already started, so
    the handler returns it (``response``) after dropping the connection."""

    def __init__(self, response: web.StreamResponse, timeout_s: float) -> None:
        super().__init__(f"client read nothing for {timeout_s:g} s")
        self.response = response


async def collect(stream: RequestStream) -> RequestUpdate:
    """The whole output of ``stream``: every update, merged, the finish on it."""
    whole: RequestUpdate | None = None
    while whole is None or whole.finish_reason is None:
        update = await stream.next()
        assert update is not None  # no keep-alive asked for
        whole = update if whole is None else whole.merge(update)
    return whole


async def write_sse(
    request: web.Request,
    request_id: str,
    updates: Updates,
    events: Events,
    keepalive: bytes = KEEPALIVE,
) -> web.StreamResponse:
    """Send the events ``events`` makes of ``updates`` as they come, and ``keepalive`` after
    every ``--sse-ping-interval`` seconds without any; a stream always ends, even after a bug
    of ours."""
    response = web.StreamResponse(headers={**SSE_HEADERS, "X-Request-Id": request_id})
    await response.prepare(request)
    request[HEADERS_SENT] = response.status
    bound_buffers(request)
    config = request.app[CONFIG]
    timeout_s, quiet_s = config.write_timeout, config.sse_ping_interval
    try:
        await paced_write(request, response, b"".join(events.opening()), timeout_s)
        while not events.ended:
            update = await updates.next(quiet_s)
            data = keepalive if update is None else b"".join(await events.take(update))
            if data:
                await paced_write(request, response, data, timeout_s)
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
            for event in events.failure_events():
                await response.write(event)
            await response.write_eof()
    finally:
        updates.close()
    return response


def sse_event(data: BaseModel | str, name: str = "") -> bytes:
    """One ``data:`` event, named by an ``event:`` line when ``name`` is given (Anthropic's and
    the Responses API's streams); a string goes out as it is (``[DONE]``, or JSON already
    made)."""
    payload = data if isinstance(data, str) else to_json(data)
    head = f"event: {name}\n".encode() if name else b""
    return head + b"data: " + payload.encode("utf-8") + b"\n\n"


# Stands in for the one string an event template leaves out; JSON writes it "\u0000".
MARK = "\x00"
_MARK_JSON = json.dumps(MARK).encode()


class EventTemplate:
    """An event made once from its model with one string field set to ``MARK``: each event
    of that kind then writes only that string's JSON into it. The model stays the one
    declaration of the event; the event of a token costs one string's JSON, not a model."""

    def __init__(self, event: bytes) -> None:
        self._head, found, self._tail = event.partition(_MARK_JSON)
        assert found and _MARK_JSON not in self._tail, event

    def __call__(self, text: str) -> bytes:
        return self._head + json.dumps(text, ensure_ascii=False).encode("utf-8") + self._tail


def progress_of(record: RequestRecord, update: RequestUpdate) -> PromptProgress | None:
    """The prefill progress ``update`` reports, when its request asked for progress."""
    if not (update.prompt_done and record.generation.return_progress):
        return None
    return PromptProgress(
        total=record.prompt_tokens,
        cache=update.cached_tokens,
        processed=update.prompt_done,
        time_ms=record.ms_since_arrival(),
    )


def bound_buffers(request: web.Request) -> None:
    """Cap the kernel and transport buffers of a streaming connection."""
    transport = request.transport
    if transport is None:
        return
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, STREAM_SNDBUF)
    transport.set_write_buffer_limits(high=STREAM_BUFFER_HIGH, low=STREAM_BUFFER_LOW)


async def paced_write(
    request: web.Request, response: web.StreamResponse, data: bytes, timeout_s: float
) -> None:
    """Write ``data`` slice by slice, each time waiting until the client has taken all but
    ``STREAM_BUFFER_LOW`` bytes; ``ClientStalled`` after ``timeout_s`` without any progress
    (0: wait as long as it takes)."""
    for start in range(0, len(data), SLICE):
        await response.write(data[start : start + SLICE])
        await _wait_for_room(request, response, timeout_s)


async def _wait_for_room(
    request: web.Request, response: web.StreamResponse, timeout_s: float
) -> None:
    transport = request.transport
    if transport is None:
        return
    left = transport.get_write_buffer_size()
    if left <= STREAM_BUFFER_LOW:
        return
    loop = asyncio.get_running_loop()
    progress_at = loop.time()
    while left > STREAM_BUFFER_LOW and not transport.is_closing():
        await asyncio.sleep(LAG_POLL_S)
        now, size = loop.time(), transport.get_write_buffer_size()
        if size < left:
            progress_at = now
        elif timeout_s > 0 and now - progress_at >= timeout_s:
            raise ClientStalled(response, timeout_s)
        left = size


def drop_connection(request: web.Request) -> None:
    """Close a stalled client's connection without flushing what it will not read."""
    if request.transport is not None:
        request.transport.abort()
