"""Every HTTP route of the frontend, in one table, and the one place they are registered."""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web

from tinyserve.frontend.anthropic.anthropic_handlers import count_tokens, messages
from tinyserve.frontend.dashboard.handlers import dashboard_asset, dashboard_page, events
from tinyserve.frontend.embeddings.embeddings_handlers import embeddings
from tinyserve.frontend.http.middlewares import Handler
from tinyserve.frontend.http.openapi_document import openapi_json
from tinyserve.frontend.native.native_handlers import generate, health, metrics, ready
from tinyserve.frontend.native.request_timeline import request_timeline
from tinyserve.frontend.openai.openai_handlers import (
    chat_completions,
    completions,
    list_models,
    retrieve_model,
)
from tinyserve.frontend.responses.responses_handlers import responses
from tinyserve.frontend.tokenize.tokenize_handlers import detokenize, tokenize, tokenizer_info


@dataclass(frozen=True)
class Route:
    """One route: a GET also answers HEAD, as aiohttp's ``add_get`` does."""

    method: str
    path: str
    handler: Handler


ROUTES = (
    Route("POST", "/generate", generate),
    Route("GET", "/health", health),
    Route("GET", "/ready", ready),
    Route("GET", "/v1/requests/{request_id}", request_timeline),
    Route("GET", "/v1/models", list_models),
    Route("GET", "/v1/models/{model:.+}", retrieve_model),  # an id may hold a "/"
    Route("POST", "/v1/completions", completions),
    Route("POST", "/v1/chat/completions", chat_completions),
    Route("POST", "/v1/responses", responses),
    Route("POST", "/v1/embeddings", embeddings),
    Route("POST", "/v1/messages", messages),
    Route("POST", "/v1/messages/count_tokens", count_tokens),
    Route("POST", "/tokenize", tokenize),
    Route("POST", "/detokenize", detokenize),
    Route("GET", "/tokenizer_info", tokenizer_info),
    Route("GET", "/openapi.json", openapi_json),
    Route("GET", "/metrics", metrics),
    Route("GET", "/v1/events", events),
    Route("GET", "/dashboard", dashboard_page),
    Route("GET", "/dashboard/{asset}", dashboard_asset),
)


def add_routes(app: web.Application) -> None:
    """Register ``ROUTES`` on ``app``."""
    for route in ROUTES:
        if route.method == "GET":
            app.router.add_get(route.path, route.handler)
        else:
            app.router.add_route(route.method, route.path, route.handler)
