"""Typed application state: what the frontend's handlers share, set up by ``http.app``
(aiohttp ``AppKey``s, not API keys)."""

from __future__ import annotations

from aiohttp import web

from tinyserve.config import Config
from tinyserve.frontend.link.engine_client import EngineClient
from tinyserve.frontend.link.engine_link import EngineLink
from tinyserve.frontend.prompt.chat_template import ChatTemplate
from tinyserve.frontend.prompt.tokenizer import Tokenizer
from tinyserve.frontend.request.gate import Gate
from tinyserve.frontend.request.notices import Notices
from tinyserve.frontend.request.sampling_defaults import SamplingDefaults
from tinyserve.metrics import FrontendMetrics
from tinyserve.tracing import Tracing

CONFIG = web.AppKey("config", Config)
CLIENT = web.AppKey("engine_client", EngineClient)
LINK = web.AppKey("engine_link", EngineLink)
TOKENIZER = web.AppKey("tokenizer", Tokenizer)
# The vocabulary of the model /v1/embeddings runs: TOKENIZER's, unless --embedding-model.
EMBED_TOKENIZER = web.AppKey("embed_tokenizer", Tokenizer)
CHAT_TEMPLATE = web.AppKey("chat_template", ChatTemplate)
# What an OpenAI request that leaves out a sampling field gets: read once, with the model.
SAMPLING_DEFAULTS = web.AppKey("sampling_defaults", SamplingDefaults)
TRACING = web.AppKey("tracing", Tracing)
METRICS = web.AppKey("metrics", FrontendMetrics)
GATE = web.AppKey("gate", Gate)
NOTICES = web.AppKey("notices", Notices)
