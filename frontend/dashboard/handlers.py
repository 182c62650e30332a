"""``GET /v1/events`` (the event feed as server-sent events) and ``GET /dashboard`` (the page).

The feed needs the same bearer key as every data route; the page and its two files need
none (they hold no data) and carry a Content-Security-Policy that allows only this origin's
script, style and fetches: no inline script, no other host. The page reads the feed with
``fetch()`` and a streamed body, not ``EventSource``, because only ``fetch`` can send the
``Authorization`` header: a key in the URL would end up in access logs and history.

A stream opens with a ``hello`` event (the node's shape), then one ``update`` event per
engine update; a comment every ``RENEW_S`` while nothing comes keeps proxies from timing it
out. It ends with an ``end`` event when this frontend drains, when the viewer reads too
slowly, or when the engine it said hello for is gone (``reason``: ``draining``,
``slow_viewer``, ``engine_gone``); the page then connects again.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from importlib import resources

from aiohttp import web

from tinyserve import protocol
from tinyserve.frontend.dashboard.hub import FEED_HUB, RENEW_S, Viewer, sse_frame
from tinyserve.frontend.models.errors import NOT_FOUND, ApiError
from tinyserve.frontend.request.admission import serving
from tinyserve.frontend.request.sse import KEEPALIVE, SSE_HEADERS
from tinyserve.frontend.request.state import CLIENT, GATE, LINK

WRITE_TIMEOUT_S = 5.0  # a viewer whose socket takes no more bytes for this long is gone
END_DRAINING = "draining"
END_SLOW = "slow_viewer"
END_ENGINE_GONE = "engine_gone"  # the engine its hello described went away or was replaced

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
PAGE_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}
# The page's files (package data): name -> content type. Nothing else is served.
ASSETS = {
    "dashboard.js": "text/javascript",
    "dashboard.css": "text/css",
}
PAGE = "index.html"


@functools.cache
def static_file(name: str) -> bytes:
    """A file of the page, from inside the installed package."""
    return resources.files("tinyserve.frontend.dashboard").joinpath("static", name).read_bytes()


async def dashboard_page(_request: web.Request) -> web.Response:
    """The dashboard's HTML."""
    return web.Response(
        body=static_file(PAGE), content_type="text/html", charset="utf-8", headers=PAGE_HEADERS
    )


async def dashboard_asset(request: web.Request) -> web.Response:
    """The page's script or style sheet; any other name is a 404."""
    name = request.match_info["asset"]
    content_type = ASSETS.get(name)
    if content_type is None:
        raise ApiError(404, NOT_FOUND, f"no dashboard file {name!r}")
    return web.Response(
        body=static_file(name), content_type=content_type, charset="utf-8", headers=PAGE_HEADERS
    )


async def events(request: web.Request) -> web.StreamResponse:
    """The node's scheduling state as server-sent events, from the engine's feed."""
    app = request.app
    ack = serving(app[LINK])
    response = web.StreamResponse(headers=SSE_HEADERS)
    await response.prepare(request)
    hello = {
        "model": ack.model_name,
        "slots": ack.slots,
        "blocks_total": ack.blocks_total,
        "block_size": ack.block_size,
        "n_ctx": ack.n_ctx,
        "max_queue": ack.max_queue,
        "interval_ms": 100,
    }
    hub = app[FEED_HUB]
    viewer = hub.join(app[CLIENT])
    try:
        with contextlib.suppress(ConnectionResetError, TimeoutError):
            await _write(response, sse_frame("hello", hello))
            reason = await _stream(request, response, viewer, ack)
            await _write(response, sse_frame("end", {"reason": reason}))
    finally:
        hub.leave(viewer)
    return response


async def _stream(
    request: web.Request, response: web.StreamResponse, viewer: Viewer, ack: protocol.HelloAck
) -> str:
    """Pass the viewer's frames on until it is cut off, this frontend drains, or the engine
    of ``ack`` (the hello's) is gone: a new one starts its feed afresh (its ``seq`` from 1,
    perhaps other slots), which the viewer must learn from a new hello."""
    hub, gate, link = request.app[FEED_HUB], request.app[GATE], request.app[LINK]
    while not gate.draining:
        if link.ack is not ack:
            return END_ENGINE_GONE
        try:
            frame = await asyncio.wait_for(viewer.queue.get(), RENEW_S)
        except TimeoutError:
            frame = KEEPALIVE
        hub.renew()
        if frame is None:
            return END_SLOW
        await _write(response, frame)
    return END_DRAINING


async def _write(response: web.StreamResponse, frame: bytes) -> None:
    await asyncio.wait_for(response.write(frame), WRITE_TIMEOUT_S)
