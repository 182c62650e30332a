"""Building the frontend's aiohttp application from a ``Config``.

Everything with a lifetime (tokenizer thread, ZMQ sockets, listener and engine-link tasks) is
owned by a ``cleanup_ctx``: started when the app starts, cancelled and awaited when it stops.
Tests and the launcher can build the same app with ``build_app(config)``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Coroutine
from typing import Any

from aiohttp import web

from tinyserve import metrics
from tinyserve.config import Config
from tinyserve.frontend.dashboard.hub import FEED_HUB, FeedHub
from tinyserve.frontend.http.auth import ApiKeys
from tinyserve.frontend.http.middlewares import middlewares
from tinyserve.frontend.http.routes import add_routes
from tinyserve.frontend.link.engine_client import EngineClient
from tinyserve.frontend.link.engine_link import EngineLink
from tinyserve.frontend.prompt.chat_template import ChatTemplate
from tinyserve.frontend.prompt.tokenizer import Tokenizer
from tinyserve.frontend.request.gate import Gate
from tinyserve.frontend.request.notices import Notices
from tinyserve.frontend.request.sampling_defaults import sampling_defaults
from tinyserve.frontend.request.state import (
    CHAT_TEMPLATE,
    CLIENT,
    CONFIG,
    EMBED_TOKENIZER,
    GATE,
    LINK,
    METRICS,
    NOTICES,
    SAMPLING_DEFAULTS,
    TOKENIZER,
    TRACING,
)
from tinyserve.logs import fields
from tinyserve.metrics import FrontendMetrics
from tinyserve.rundir import prepare_runtime_dir
from tinyserve.tracing import Tracing

log = logging.getLogger(__name__)


def build_app(config: Config, tracing: Tracing | None = None) -> web.Application:
    """The frontend app; its engine connection starts when the app starts. Raises
    ``TinyServeError`` for an unsafe runtime dir or an unreadable key file."""
    prepare_runtime_dir(config.runtime_dir)
    keys = ApiKeys.of_config(config)
    # One per process (metrics.setup), built before any metric value exists.
    meters = FrontendMetrics.of(metrics.setup(config.runtime_dir, metrics.FRONTEND))
    gate = Gate(config.max_connections)
    app = web.Application(
        middlewares=middlewares(meters, keys, config, gate), client_max_size=config.max_body_bytes
    )
    app[CONFIG] = config
    app[TRACING] = tracing or Tracing()  # the caller owns it (and flushes it at exit)
    app[GATE] = gate
    app[METRICS] = meters
    app[NOTICES] = Notices(meters)
    app[FEED_HUB] = FeedHub()
    app.cleanup_ctx.append(_tokenizer_ctx)
    app.cleanup_ctx.append(_engine_ctx)
    app.on_response_prepare.append(_stamp_response)
    add_routes(app)
    return app


async def drain_app(app: web.Application, timeout_s: float) -> None:
    """Refuse new requests now and wait up to ``timeout_s`` for those in progress; streams
    still open after that end with an error event (their handlers then cancel them in the
    engine)."""
    gate = app[GATE]
    gate.begin_drain()
    log.info("draining", extra=fields(in_progress=gate.in_progress, timeout_s=timeout_s))
    if await gate.wait_idle(timeout_s):
        return
    log.warning("drain timeout: ending open streams", extra=fields(open=gate.in_progress))
    app[CLIENT].fail_all("frontend shutting down: drain timeout reached")


async def _stamp_response(request: web.Request, response: web.StreamResponse) -> None:
    # Which of the frontends sharing the port answered: the first question when debugging.
    response.headers["X-TinyServe-Frontend"] = str(os.getpid())
    request.app[NOTICES].report(request, response)


async def _tokenizer_ctx(app: web.Application) -> AsyncIterator[None]:
    tokenizer = await Tokenizer.load(app[CONFIG])
    facts = tokenizer.facts
    app[TOKENIZER] = tokenizer
    app[CHAT_TEMPLATE] = ChatTemplate.of_model(facts)
    app[SAMPLING_DEFAULTS] = sampling_defaults(app[CONFIG], facts.sampling_metadata)
    embedding_model = app[CONFIG].embedding_model
    embed = await Tokenizer.load(app[CONFIG], embedding_model) if embedding_model else tokenizer
    app[EMBED_TOKENIZER] = embed
    yield
    if embed is not tokenizer:
        embed.close()
    tokenizer.close()


async def _engine_ctx(app: web.Application) -> AsyncIterator[None]:
    client = EngineClient(app[CONFIG])
    link = EngineLink(app[CONFIG], client, app[METRICS])
    app[CLIENT], app[LINK] = client, link
    log.info("frontend id", extra=fields(frontend_id=client.frontend_id))
    tasks = [_task(client.listen(), "engine-listener"), _task(link.run(), "engine-link")]
    yield
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await task
    client.close()


def _task(coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
    task = asyncio.create_task(coro, name=name)
    task.add_done_callback(_log_crash)
    return task


def _log_crash(task: asyncio.Task[None]) -> None:
    # These tasks run for the app's whole life; one that ends early is a bug worth a loud log.
    if not task.cancelled() and task.exception() is not None:
        log.error(
            "background task died", exc_info=task.exception(), extra=fields(task=task.get_name())
        )
