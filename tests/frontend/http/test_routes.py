"""The route table: every route in it is served, GETs answer HEAD too, nothing else is served."""

from __future__ import annotations

import re
from typing import Any

from aiohttp.test_utils import TestClient

from tinyserve.frontend.http.routes import ROUTES

Client = TestClient[Any, Any]


def served_routes(client: Client) -> set[tuple[str, str]]:
    assert client.app is not None
    return {
        (route.method, route.resource.canonical)
        for route in client.app.router.routes()
        if route.resource is not None
    }


async def test_the_app_serves_exactly_the_table(client: Client) -> None:
    # aiohttp names a route by its path without the patterns of its variables.
    table = {(route.method, re.sub(r"{(\w+):[^}]+}", r"{\1}", route.path)) for route in ROUTES}
    heads = {("HEAD", path) for method, path in table if method == "GET"}
    assert served_routes(client) == table | heads


async def test_a_route_of_the_table_is_answered(served: Client) -> None:
    response = await served.get("/health")
    assert response.status == 200
    response = await served.head("/health")
    assert response.status == 200
