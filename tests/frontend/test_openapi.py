"""The OpenAPI document stays in sync with the routes and with what the parsers accept."""

from __future__ import annotations

from typing import Any

from aiohttp.test_utils import TestClient

from tinyserve.frontend import openai_schema, validation
from tinyserve.frontend.openapi import document
from tinyserve.frontend.openapi_schemas import SCHEMAS, with_max_tokens_limit

Client = TestClient[Any, Any]


def refs(node: Any) -> list[str]:
    """Every ``$ref`` below ``node``."""
    if isinstance(node, dict):
        own = [node["$ref"]] if "$ref" in node else []
        return own + [r for value in node.values() for r in refs(value)]
    if isinstance(node, list):
        return [r for item in node for r in refs(item)]
    return []


def properties(name: str) -> set[str]:
    return set(SCHEMAS[name]["properties"])


async def test_every_route_is_documented_and_nothing_else(client: Client) -> None:
    routes = {
        (route.method.lower(), route.resource.canonical)
        for route in client.app.router.routes()
        if route.resource is not None and route.method != "HEAD"  # aiohttp adds HEAD to GETs
    }
    documented = {(method, path) for path, item in document()["paths"].items() for method in item}
    assert documented == routes


async def test_served_document_is_the_document(client: Client) -> None:
    response = await client.get("/openapi.json")
    assert response.status == 200
    assert await response.json() == with_max_tokens_limit(document(), 256)  # the fixture's


def test_every_reference_resolves() -> None:
    doc = document()
    names = {f"#/components/schemas/{name}" for name in doc["components"]["schemas"]}
    assert set(refs(doc)) <= names


def test_request_schemas_list_exactly_the_accepted_fields() -> None:
    assert properties("GenerateRequest") == validation.FIELDS
    completion = openai_schema.COMPLETION_FIELDS | set(openai_schema.COMPLETION_DEFAULT_ONLY)
    assert properties("CompletionRequest") == completion
    chat = (
        openai_schema.CHAT_FIELDS
        | openai_schema.CHAT_IGNORED
        | set(openai_schema.CHAT_DEFAULT_ONLY)
    )
    assert properties("ChatCompletionRequest") == chat
