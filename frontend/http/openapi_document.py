"""The OpenAPI 3.1 document of the whole HTTP surface, served at ``GET /openapi.json``.

``OPERATIONS`` lists every route with the models of its bodies (each surface's own, in its
folder, and the shared ones of ``models``), whose JSON Schemas are the document's components;
a test checks it against ``app.router``, so a route added without a description here fails
the suite.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from aiohttp import web
from pydantic import BaseModel, Field, RootModel
from pydantic.json_schema import (
    GenerateJsonSchema,
    JsonSchemaMode,
    JsonSchemaValue,
    models_json_schema,
)
from pydantic_core import core_schema

from tinyserve.frontend.anthropic import anthropic_replies, anthropic_requests
from tinyserve.frontend.dashboard import feed
from tinyserve.frontend.embeddings import embeddings_bodies as embeddings
from tinyserve.frontend.http.auth import is_open
from tinyserve.frontend.models import chat
from tinyserve.frontend.models.common import IgnoredItem
from tinyserve.frontend.models.errors import AnthropicError, Error, OpenAIError
from tinyserve.frontend.native import native_bodies as native
from tinyserve.frontend.openai import openai_replies, openai_requests
from tinyserve.frontend.responses import responses_replies, responses_requests
from tinyserve.frontend.tokenize import tokenize_bodies as tokenize

OPENAPI_VERSION = "3.1.0"
BEARER = "bearer"  # the security schemes of the API keys: a bearer token, or x-api-key
API_KEY = "apiKey"
REF = "#/components/schemas/{model}"
SSE = "text/event-stream"
Schema = dict[str, Any]
Model = type[BaseModel]


class OpenAPIDocument(RootModel[dict[str, Any]]):
    """This document."""


class MetricsText(RootModel[str]):
    root: str = Field(description="Prometheus text exposition format")


@dataclass(frozen=True)
class Operation:
    """One route: what it takes, what it answers, which errors it can give."""

    method: str
    path: str
    summary: str
    ok: Model  # the 200 body
    request: Model | None = None  # the JSON request body
    events: Model | None = None  # the data of one SSE event, when it can stream
    errors: tuple[int, ...] = ()
    error_schema: Model = Error
    media: str = "application/json"  # of the 200 body
    done: bool = False  # its stream ends with the literal [DONE] (OpenAI's chat and completions)


_GENERATION_ERRORS = (400, 404, 415, 429, 500, 503)
OPERATIONS: tuple[Operation, ...] = (
    Operation("post", "/generate", "Generate a completion (native API)", native.GenerateReply,
              native.GenerateRequest, native.GenerateEvent, (400, 415, 429, 500, 503)),
    Operation("get", "/health", "200 while the process runs", native.HealthReply),
    Operation("get", "/ready", "200 once an engine serves this frontend", native.HealthReply,
              errors=(503,)),
    Operation("get", "/v1/models", "The served model", openai_replies.ModelList, errors=(503,),
              error_schema=OpenAIError),
    Operation("get", "/v1/models/{model}", "The served model, by its id",
              openai_replies.Model, errors=(404, 503), error_schema=OpenAIError),
    Operation("post", "/v1/completions", "OpenAI completions", openai_replies.Completion,
              openai_requests.CompletionRequest, openai_replies.CompletionChunk,
              _GENERATION_ERRORS, OpenAIError, done=True),
    Operation("post", "/v1/chat/completions", "OpenAI chat completions",
              openai_replies.ChatCompletion, chat.ChatCompletionRequest,
              openai_replies.ChatCompletionChunk, _GENERATION_ERRORS, OpenAIError,
              done=True),
    Operation("post", "/v1/responses", "OpenAI Responses, stateless (events named by their "
              "type)", responses_replies.Response, responses_requests.ResponsesRequest,
              responses_replies.ResponsesEvent, _GENERATION_ERRORS, OpenAIError),
    Operation("post", "/v1/embeddings", "OpenAI embeddings (L2-normalised, the GGUF's pooling)",
              embeddings.EmbeddingsReply, embeddings.EmbeddingsRequest,
              errors=(400, 404, 415, 429, 500, 503), error_schema=OpenAIError),
    Operation("post", "/v1/messages", "Anthropic Messages (events named by their type)",
              anthropic_replies.AnthropicMessage, anthropic_requests.MessagesRequest,
              anthropic_replies.MessagesEvent, _GENERATION_ERRORS, AnthropicError),
    Operation("post", "/v1/messages/count_tokens", "The prompt tokens of an Anthropic Messages "
              "request", anthropic_replies.TokenCount, anthropic_requests.CountTokensRequest,
              errors=(400, 404, 415), error_schema=AnthropicError),
    Operation("post", "/tokenize", "Token ids of a text or a conversation (vLLM's shape)",
              tokenize.TokenizeReply, tokenize.TokenizeRequest, errors=(400, 404, 415)),
    Operation("post", "/detokenize", "Text of token ids (vLLM's shape)",
              tokenize.DetokenizeReply, tokenize.DetokenizeRequest, errors=(400, 404, 415)),
    Operation("get", "/tokenizer_info", "The vocabulary's special tokens, BOS rule and chat "
              "template (vLLM's shape)", tokenize.TokenizerInfo),
    Operation("get", "/openapi.json", "This document", OpenAPIDocument),
    Operation("get", "/v1/requests/{request_id}", "Timeline of a recent request",
              native.RequestTimeline, errors=(404, 503), error_schema=OpenAIError),
    Operation("get", "/metrics", "Prometheus metrics of the whole node (engine and every "
              "frontend)", MetricsText, media="text/plain"),
    Operation("get", "/v1/events", "The node's scheduling state, live (server-sent events: "
              "hello, then update at most 10 a second, end)", feed.FeedEvent,
              errors=(503,), error_schema=OpenAIError, media=SSE),
    Operation("get", "/dashboard", "The live scheduler dashboard (HTML)", feed.Page,
              media="text/html"),
    Operation("get", "/dashboard/{asset}", "The dashboard's script and style sheet",
              feed.Asset, errors=(404,), media="text/plain"),
)  # fmt: skip

_ERROR_TEXT = {
    400: "invalid request (type invalid_request / context_length_exceeded)",
    401: "no valid API key (only when the server has keys; WWW-Authenticate: Bearer)",
    413: "body over the server's --max-body-bytes",
    404: "unknown model, or no recent request with that id",
    408: "the body did not arrive within the server's --body-timeout",
    415: "a Content-Type other than JSON (none at all is taken as JSON)",
    429: "this frontend is at --max-connections (frontend_busy); retry after Retry-After",
    500: "engine or server error",
    503: "overloaded, draining or no engine; retry after Retry-After seconds",
}


def document() -> dict[str, Any]:
    """The whole OpenAPI document."""
    paths: dict[str, dict[str, Any]] = {}
    for op in OPERATIONS:
        paths.setdefault(op.path, {})[op.method] = _operation(op)
    return {
        "openapi": OPENAPI_VERSION,
        "info": {
            "title": "TinyServe",
            "version": _version(),
            "description": "Native /generate API, an OpenAI-compatible API (chat, completions, "
            "Responses) and Anthropic's Messages API; see docs/api.md.",
        },
        "paths": paths,
        "components": {
            "schemas": components(),
            "securitySchemes": {
                BEARER: {"type": "http", "scheme": "bearer"},
                API_KEY: {"type": "apiKey", "in": "header", "name": "x-api-key"},
            },
        },
    }


@functools.cache
def components() -> dict[str, Schema]:
    """The JSON Schema of every body: requests as they are validated, replies as they are
    written."""
    requests = dict.fromkeys(op.request for op in OPERATIONS if op.request)
    bodies = (m for op in OPERATIONS for m in (op.ok, op.events, op.error_schema) if m)
    models: list[tuple[Model, JsonSchemaMode]] = [(m, "validation") for m in requests]
    models += [(m, "serialization") for m in dict.fromkeys(bodies) if m not in requests]
    _, schema = models_json_schema(models, ref_template=REF, schema_generator=_Generator)
    return dict(sorted(schema["$defs"].items()))


class _Generator(GenerateJsonSchema):
    def field_title_should_be_set(self, schema: core_schema.CoreSchema) -> bool:
        return False  # a property's title would only repeat its name

    def tagged_union_schema(self, schema: core_schema.TaggedUnionSchema) -> JsonSchemaValue:
        # A union open to other types (an IgnoredItem takes any object with a type) is "any
        # of": the object of a known type is also an object of some type.
        union = super().tagged_union_schema(schema)
        if IgnoredItem.__name__ in json.dumps(union.get("oneOf", [])):
            union["anyOf"] = union.pop("oneOf")
        return union


def ref(model: Model) -> Schema:
    """A reference to ``model``'s component schema."""
    return {"$ref": REF.format(model=model.__name__)}


async def openapi_json(request: web.Request) -> web.Response:
    """This server's OpenAPI document."""
    return web.json_response(document())


def _operation(op: Operation) -> dict[str, Any]:
    ok: dict[str, Schema] = {op.media: {"schema": ref(op.ok)}}
    if op.events is not None:
        # One event's data; a stream is what 'stream': true asks for.
        ok[SSE] = {"schema": _sse_event(op.events, op.error_schema, op.done)}
    responses: dict[str, Any] = {"200": {"description": "OK", "content": ok}}
    for status in op.errors:
        responses[str(status)] = _error_response(status, op.error_schema)
    if op.request is not None:  # every body is read by the same gate (models/parse.py)
        for status in (408, 413):
            responses[str(status)] = _error_response(status, op.error_schema)
    operation: dict[str, Any] = {"summary": op.summary, "responses": responses}
    if not is_open(op.path):
        # A key is needed only once the server has any (docs/api.md): either header, or none.
        operation["security"] = [{BEARER: []}, {API_KEY: []}, {}]
        responses["401"] = _error_response(401, op.error_schema)
    names = re.findall(r"{(\w+)}", op.path)
    if names:
        path_param = {"in": "path", "required": True, "schema": {"type": "string"}}
        operation["parameters"] = [{"name": n, **path_param} for n in names]
    if op.request is not None:
        body = {"application/json": {"schema": ref(op.request)}}
        operation["requestBody"] = {"required": True, "content": body}
    return operation


def _sse_event(data: Model, error: Model, done: bool) -> Schema:
    """One server-sent event whose data is a JSON ``data`` object (or ``error`` after a failure
    mid-stream), and with ``done`` possibly the literal ``[DONE]`` that ends OpenAI streams.
    Like OpenAPI 3.2's ``itemSchema``: the fields of the event, the data's own schema inside."""
    json_data = {
        "type": "string",
        "contentMediaType": "application/json",
        "contentSchema": {"anyOf": [ref(data), ref(error)]},
    }
    return {
        "type": "object",
        "properties": {
            "data": {"anyOf": [json_data, {"const": "[DONE]"}]} if done else json_data,
            "event": {"type": "string"},
            "id": {"type": "string"},
            "retry": {"type": "integer"},
        },
        "required": ["data"],
        "additionalProperties": False,
    }


def _error_response(status: int, schema: Model) -> dict[str, Any]:
    response: dict[str, Any] = {
        "description": _ERROR_TEXT[status],
        "content": {"application/json": {"schema": ref(schema)}},
    }
    if status in (429, 503):
        retry = {"schema": {"type": "integer"}, "description": "seconds to wait"}
        response["headers"] = {"Retry-After": retry}
    if status == 401:
        challenge = {"schema": {"const": "Bearer"}, "description": "the scheme to use"}
        response["headers"] = {"WWW-Authenticate": challenge}
    return response


def _version() -> str:
    try:
        return metadata.version("tinyserve")
    except metadata.PackageNotFoundError:
        return "0"
