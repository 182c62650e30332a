"""Streams to clients that read slowly or not at all.

A slow reader costs bounded memory. Its stream merges pending engine updates into one
(``streams.RequestStream``), and the bytes on their way to it sit in small buffers: the
socket's send buffer is capped at ``STREAM_SNDBUF`` (Linux doubles it; autotuning could
otherwise let one stalled connection pin megabytes of kernel memory), and after each event
``paced_write`` waits until the transport has handed its buffer down to ``STREAM_BUFFER_LOW``
bytes, so aiohttp's own 64 KiB of slack is never used. While it waits, new output merges.

A reader that takes nothing for ``--write-timeout`` seconds (the buffer does not shrink at
all) is stalled: ``ClientStalled`` is raised, the request is cancelled in the engine (reason
``client_stalled``) and the connection is dropped. One that takes anything keeps its stream.
"""

from __future__ import annotations

import asyncio
import socket

from aiohttp import web

# A token stream needs a few KB/s; 16 KiB (32 KiB once the kernel doubles it) still carries
# over 150 KB/s at a 200 ms round trip.
STREAM_SNDBUF = 16 * 1024
STREAM_BUFFER_HIGH = 16 * 1024  # the transport pauses aiohttp's writer above this
STREAM_BUFFER_LOW = 4 * 1024  # ... and resumes it at or below this
# Written at most this much at a time (room for chunked encoding's few bytes), a write after
# the wait never lifts the buffer above the high mark, so aiohttp never blocks on its own.
SLICE = STREAM_BUFFER_HIGH - STREAM_BUFFER_LOW - 256
POLL_S = 0.02  # how often a waiting writer looks at the buffer (only while it lags)


class ClientStalled(Exception):
    """The client took nothing for the write timeout. The response was already started, so
    the handler returns it (``response``) after dropping the connection."""

    def __init__(self, response: web.StreamResponse, timeout_s: float) -> None:
        super().__init__(f"client read nothing for {timeout_s:g} s")
        self.response = response


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
    loop = asyncio.get_running_loop()
    left = transport.get_write_buffer_size()
    progress_at = loop.time()
    while left > STREAM_BUFFER_LOW and not transport.is_closing():
        await asyncio.sleep(POLL_S)
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
