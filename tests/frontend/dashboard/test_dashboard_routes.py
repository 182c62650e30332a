"""GET /v1/events and GET /dashboard through the frontend, against the stand-in engine."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer

from tests.frontend.harness import FakeEngine, until, wait_serving
from tinyserve import feed_protocol
from tinyserve.config import Config, build_config
from tinyserve.frontend.dashboard import handlers
from tinyserve.frontend.dashboard.hub import FEED_HUB, LEASE_S
from tinyserve.frontend.http.app import build_app
from tinyserve.frontend.request.state import GATE

Client = TestClient[Any, Any]


def update(seq: int = 1) -> feed_protocol.FeedUpdate:
    slot = {"request_id": "r1", "tenant": "a", "priority": 0, "phase": "decode", "n_past": 9,
            "prompt_tokens": 8, "cached_tokens": 0, "generated": 1, "max_tokens": 4}  # fmt: skip
    return feed_protocol.FeedUpdate(
        seq, 5_000_000, 0.1, 9, 2, {"tokens": 3.0, "generated": 2.0}, [slot, None],
        [{"tenant": "b", "priority": 1, "count": 3}], {"total": 32, "used": 2, "cached": 1,
        "free": 29}, [{"kind": "grant", "request_id": "r1"}],
    )  # fmt: skip


async def next_event(content: aiohttp.StreamReader) -> tuple[str, dict[str, Any]]:
    """The next event of an SSE body that carries data (keep-alive comments skipped)."""
    while True:
        block = (await content.readuntil(b"\n\n")).decode()
        lines = dict(line.split(": ", 1) for line in block.strip().split("\n"))
        if "data" in lines:
            return lines["event"], json.loads(lines["data"])


async def test_the_feed_needs_an_engine(client: Client) -> None:
    response = await client.get("/v1/events")
    assert response.status == 503
    assert "engine_unavailable" in json.dumps(await response.json())


async def test_a_viewer_gets_hello_then_the_engines_updates(
    served: Client, engine: FakeEngine
) -> None:
    async with served.get("/v1/events") as response:
        assert response.status == 200
        assert response.headers["Content-Type"] == "text/event-stream"
        assert response.headers["X-Accel-Buffering"] == "no"
        event, hello = await next_event(response.content)
        assert event == "hello" and hello["slots"] == 4 and hello["blocks_total"] == 32
        await until(lambda: bool(engine.leases))
        assert engine.leases[0].seconds == LEASE_S
        assert engine.leases[0].frontend_id == served.app[FEED_HUB]._client.frontend_id  # type: ignore[union-attr]
        # The SUB subscription may lag the lease: publish until one arrives.
        sent = 0

        async def publish() -> None:
            nonlocal sent
            while True:
                sent += 1
                await engine.publish_feed(update(sent))
                await asyncio.sleep(0.05)

        publisher = asyncio.create_task(publish())
        try:
            event, body = await asyncio.wait_for(next_event(response.content), 5)
        finally:
            publisher.cancel()
        assert event == "update"
        assert body["slots"][0]["request_id"] == "r1" and body["slots"][1] is None
        assert body["queue"] == [{"tenant": "b", "priority": 1, "count": 3}]
        assert body["kv"]["free"] == 29 and body["at_ms"] == 5.0
    # The last viewer gone: the frontend ends its lease at once.
    await until(lambda: engine.leases[-1].seconds == 0)
    assert served.app[FEED_HUB].viewers == 0


async def test_the_lease_is_renewed_while_a_viewer_stays(
    served: Client, engine: FakeEngine
) -> None:
    async with served.get("/v1/events") as response:
        await next_event(response.content)
        await until(lambda: len(engine.leases) >= 3, timeout_s=10)
        assert all(lease.seconds == LEASE_S for lease in engine.leases)


async def test_a_draining_frontend_ends_the_stream(served: Client, engine: FakeEngine) -> None:
    async with served.get("/v1/events") as response:
        await next_event(response.content)
        served.app[GATE].begin_drain()
        event, body = await asyncio.wait_for(next_event(response.content), 5)
        assert (event, body) == ("end", {"reason": "draining"})


async def test_the_stream_ends_when_its_engine_is_gone(served: Client, engine: FakeEngine) -> None:
    async with served.get("/v1/events") as response:
        await next_event(response.content)
        engine.beating = False  # the frontend loses it: a new engine would start a new feed
        event, body = await asyncio.wait_for(next_event(response.content), 10)
        assert (event, body) == ("end", {"reason": "engine_gone"})


async def test_the_page_is_served_with_a_strict_policy(client: Client) -> None:
    response = await client.get("/dashboard")
    assert response.status == 200 and response.content_type == "text/html"
    policy = response.headers["Content-Security-Policy"]
    assert "default-src 'none'" in policy and "script-src 'self'" in policy
    assert "unsafe-inline" not in policy and "http" not in policy
    html = await response.text()
    assert "<script>" not in html  # no inline script: the policy would block it anyway
    # Every file the page loads is one of ours, under /dashboard/.
    for src in re.findall(r'(?:src|href)="([^"]+)"', html):
        assert src.startswith("/dashboard/"), src
        asset = await client.get(src)
        assert asset.status == 200 and asset.headers["Content-Security-Policy"] == policy


async def test_an_unknown_dashboard_file_is_a_404(client: Client) -> None:
    response = await client.get("/dashboard/../auth.py")
    assert response.status == 404
    response = await client.get("/dashboard/secret.js")
    assert response.status == 404 and "secret.js" in (await response.json())["error"]["message"]


def test_the_page_names_no_other_origin() -> None:
    for name in [handlers.PAGE, *handlers.ASSETS]:
        text = handlers.static_file(name).decode()
        urls = re.findall(r"https?://[^\s\"'`)]+", text)
        # The SVG namespace is an identifier, never fetched.
        assert set(urls) <= {"http://www.w3.org/2000/svg"}, (name, urls)


def test_the_pages_files_are_package_data() -> None:
    setup = (Path(__file__).parents[3] / "setup.py").read_text()
    assert '"tinyserve.frontend.dashboard.static": ["*.html", "*.js", "*.css"]' in setup
    for name in [handlers.PAGE, *handlers.ASSETS]:
        assert handlers.static_file(name)


@pytest.fixture
def keyed_config(tmp_path: Path) -> Config:
    return build_config({"runtime_dir": str(tmp_path), "api_key": ("k1",)}, environ={})


async def test_with_keys_the_page_is_open_and_the_feed_needs_one(keyed_config: Config) -> None:
    engine = FakeEngine(keyed_config).start()
    try:
        async with TestClient(TestServer(build_app(keyed_config))) as client:
            await wait_serving(client)
            assert (await client.get("/dashboard")).status == 200
            assert (await client.get("/dashboard/dashboard.js")).status == 200
            assert (await client.get("/v1/events")).status == 401
            bad = {"Authorization": "Bearer nope"}
            assert (await client.get("/v1/events", headers=bad)).status == 401
            good = {"Authorization": "Bearer k1"}
            async with client.get("/v1/events", headers=good) as response:
                assert response.status == 200
                assert (await next_event(response.content))[0] == "hello"
    finally:
        await engine.stop()
