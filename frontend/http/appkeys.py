"""Typed application state: what the frontend's handlers share, set up by ``app.build_app``."""

from __future__ import annotations

from aiohttp import web

from tinyserve.config import Config
from tinyserve.frontend.link.engine_client import EngineClient
from tinyserve.frontend.link.engine_link import EngineLink
from tinyserve.frontend.openai.chat_template import ChatTemplate
from tinyserve.frontend.request.tokenizer import Tokenizer
from tinyserve.metrics import Metrics
from tinyserve.tracing import Tracing

CONFIG = web.AppKey("config", Config)
CLIENT = web.AppKey("engine_client", EngineClient)
LINK = web.AppKey("engine_link", EngineLink)
TOKENIZER = web.AppKey("tokenizer", Tokenizer)
CHAT_TEMPLATE = web.AppKey("chat_template", ChatTemplate)
TRACING = web.AppKey("tracing", Tracing)
METRICS = web.AppKey("metrics", Metrics)
