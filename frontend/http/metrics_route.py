"""``GET /metrics`` and the response counter every HTTP response goes through."""

from __future__ import annotations

import asyncio

from aiohttp import web
from aiohttp.typedefs import Middleware

from tinyserve.frontend.http.api_errors import Handler, status_when_gone
from tinyserve.frontend.http.appkeys import METRICS
from tinyserve.metrics import CONTENT_TYPE, Metrics

UNMATCHED_ROUTE = "unmatched"  # no route (404) or none for the method (405): a bounded label


def http_middleware(metrics: Metrics) -> Middleware:
    """Count every response by route pattern and status: what the pipeline never sees too
    (401, 413, 415, unparsable bodies, drain and busy 503s, 404s)."""
    responses = metrics.counter("tinyserve_http_responses_total")

    @web.middleware
    async def count_response(request: web.Request, handler: Handler) -> web.StreamResponse:
        resource = request.match_info.route.resource
        route = resource.canonical if resource is not None else UNMATCHED_ROUTE
        code: int | None = None
        try:
            response = await handler(request)
            code = response.status
            return response
        except web.HTTPException as exc:  # answered by aiohttp itself (e.g. 405)
            code = exc.status
            raise
        finally:  # no code: the client went away (a stream's headers may have gone out)
            responses.labels(route, str(code or status_when_gone(request))).inc()

    return count_response


async def metrics_handler(request: web.Request) -> web.Response:
    """The node's metrics: engine and every frontend, merged from their files."""
    # Reading every process's files takes milliseconds: off the event loop, between streams.
    body = await asyncio.to_thread(request.app[METRICS].render)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})
