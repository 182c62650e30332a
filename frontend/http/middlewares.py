"""Every middleware, in the order a request meets them (``middlewares``): the response
counter, the error shape, the API keys (only when some are configured), the gate.

- The counter is outermost, so it sees the status actually sent, refusals that never reach
  the pipeline included (401, 413, 415, unparsable bodies, drain 503s, busy 429s, 404s).
- The error middleware gives every error, aiohttp's own 404/405/413 included, the JSON shape
  of the path's surface: OpenAI's under ``/v1/``, Anthropic's under ``/v1/messages``, the
  native one elsewhere (``models.errors``).
- The key check comes before the gate, so a request without a key takes no in-flight place.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.typedefs import Middleware

from tinyserve.config import Config
from tinyserve.frontend.http.auth import ApiKeys, needs_key, presented_key, unauthorized
from tinyserve.frontend.models.errors import (
    INTERNAL_ERROR,
    INVALID_REQUEST,
    ApiError,
    Shape,
    internal_error,
)
from tinyserve.frontend.request.gate import Gate
from tinyserve.frontend.request.observe import status_when_gone
from tinyserve.logs import RateLimitedLog, fields
from tinyserve.metrics import FrontendMetrics

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

UNMATCHED_ROUTE = "unmatched"  # no route (404) or none for the method (405): a bounded label
# Paths whose errors take OpenAI's shape, and within them those that take Anthropic's.
OPENAI_PREFIX = "/v1/"
ANTHROPIC_PATH = "/v1/messages"
# aiohttp raises these itself (unknown route, wrong method, body over client_max_size).
_HTTP_TYPES = {
    404: "not_found",
    405: "method_not_allowed",
    413: "request_too_large",
}
# The gate lets these through uncounted: a busy or draining frontend still reports.
ALWAYS_ANSWERED = frozenset({"/health", "/metrics"})
PROBE = "/ready"  # refused while draining, never counted


def middlewares(
    metrics: FrontendMetrics, keys: ApiKeys, config: Config, gate: Gate
) -> list[Middleware]:
    """The app's middlewares, outermost first."""
    chain = [count_responses(metrics), errors]
    if keys.enabled:
        chain.append(check_keys(keys, config))
    return [*chain, gated(gate)]


def count_responses(metrics: FrontendMetrics) -> Middleware:
    """Count every response by route pattern and status."""
    responses = metrics.http_responses_total

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


@web.middleware
async def errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Turn ``ApiError`` and aiohttp's own HTTP errors into the JSON error shape of the path."""
    shape = shape_of(request.path)
    try:
        return await handler(request)
    except ApiError as exc:
        return exc.response(shape)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return _from_http_exception(exc).response(shape)
    except Exception:
        # A bug of ours: the client still gets the JSON shape, the log gets the traceback.
        log.exception("unhandled error", extra=fields(path=request.path))
        return internal_error().response(shape)


def shape_of(path: str) -> Shape:
    """The error shape of the surface ``path`` belongs to."""
    if path == ANTHROPIC_PATH or path.startswith(ANTHROPIC_PATH + "/"):
        return "anthropic"
    return "openai" if path.startswith(OPENAI_PREFIX) else "native"


def _from_http_exception(exc: web.HTTPException) -> ApiError:
    type_ = _HTTP_TYPES.get(exc.status, INVALID_REQUEST if exc.status < 500 else INTERNAL_ERROR)
    # Allow (405) and similar headers stay meaningful; the content type and length are ours.
    skip = {"content-type", "content-length"}
    headers = {k: v for k, v in exc.headers.items() if k.lower() not in skip}
    # 413's text names the limit ("Maximum request body size N exceeded, ..."); keep it.
    message = (exc.text or exc.reason) if exc.status == 413 else exc.reason
    return ApiError(exc.status, type_, message, headers=headers)


def check_keys(keys: ApiKeys, config: Config) -> Middleware:
    """Refuse requests without an accepted key (``http.auth``)."""
    refused = RateLimitedLog(log)

    @web.middleware
    async def check_key(request: web.Request, handler: Handler) -> web.StreamResponse:
        if needs_key(request.path, config):
            token = presented_key(request)
            if token is None or not keys.accepts(token):
                refused.warning("refused request without a valid API key", path=request.path)
                raise unauthorized()
        return await handler(request)

    return check_key


def gated(gate: Gate) -> Middleware:
    """Count each request in progress through ``gate``, which may refuse it."""

    @web.middleware
    async def gated_request(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path in ALWAYS_ANSWERED:
            return await handler(request)
        if request.path == PROBE:
            gate.refuse_if_draining()
            return await handler(request)
        gate.enter()
        try:
            return await handler(request)
        finally:
            gate.leave()

    return gated_request
