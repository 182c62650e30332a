"""The dashboard in a real headless Chromium against a real node under load, with API keys.

What a person would see: one row per slot, bars carrying the ids of the requests this test
sent, KV and queue figures equal to the node's /metrics, a request's timeline after a click;
a screenshot is saved in the test's directory. And the page asks nothing of another origin.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import pytest

from .browser import Browser, chromium_or_skip
from .node import Node

pytestmark = pytest.mark.integration

SLOTS = 3
KEY = "dashboard-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
TENANTS = ["alpha", "beta", "gamma", "delta"]
SENT: list[str] = []  # every request id this module sent, whichever test ran first


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    chromium_or_skip()  # before the node: a skip costs nothing
    flags = ("--slots", str(SLOTS), "--ctx-per-slot", "512", "--max-queue", "32", "--api-key", KEY)
    running = Node(tmp_path_factory.mktemp("dashboard"), *flags, frontends=2).start()
    yield running
    assert running.stop() == 0


@pytest.fixture
async def browser(tmp_path: Path) -> AsyncIterator[Browser]:
    chromium_or_skip()
    opened = await Browser(tmp_path).start()
    yield opened
    await opened.close()


async def open_dashboard(browser: Browser, node: Node) -> None:
    """Load the page and give it the key, as a person would (type it, press Connect)."""
    await browser.goto(f"{node.url}/dashboard")
    await browser.evaluate(f"document.getElementById('api-key').value = {json.dumps(KEY)}")
    await browser.evaluate("document.getElementById('connect').click()")
    await browser.until("document.getElementById('status').textContent === 'live'")


async def load(session: aiohttp.ClientSession, url: str, ids: list[str], rounds: int) -> None:
    """Requests from every tenant, more at once than there are slots, ``rounds`` times."""

    async def one(tenant: str) -> None:
        body = {"prompt": f"{tenant} counts: 1, 2, 3,", "max_tokens": 24, "ignore_eos": True,
                "tenant": tenant}  # fmt: skip
        async with session.post(f"{url}/generate", json=body, headers=AUTH) as resp:
            assert resp.status == 200, await resp.text()
            ids.append(resp.headers["X-Request-Id"])
            SENT.append(resp.headers["X-Request-Id"])

    for _ in range(rounds):
        await asyncio.gather(*(one(t) for t in TENANTS))


async def metric(session: aiohttp.ClientSession, url: str, name: str) -> float:
    async with session.get(f"{url}/metrics", headers=AUTH) as resp:
        text = await resp.text()
    match = re.search(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.MULTILINE)
    assert match, f"{name} not in /metrics"
    return float(match.group(1))


async def page_figures(browser: Browser) -> dict[str, float]:
    ids = ["kv-used", "kv-cached", "kv-free", "kv-total", "queue-total"]
    text = await browser.evaluate(
        f"JSON.stringify({json.dumps(ids)}.map(id => document.getElementById(id).textContent))"
    )
    return dict(zip(ids, (float(v) for v in json.loads(text)), strict=True))


async def test_the_dashboard_shows_live_slots_figures_and_a_timeline(
    node: Node, browser: Browser, tmp_path: Path
) -> None:
    await open_dashboard(browser, node)
    ids: list[str] = []
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        running = asyncio.create_task(load(session, node.url, ids, rounds=3))
        # One row per slot, and bars appear while the load runs.
        rows = await browser.until("document.querySelectorAll('#slots .slot-row').length")
        assert rows == SLOTS
        await browser.until("document.querySelectorAll('#slots rect.bar').length > 0")
        await browser.screenshot(tmp_path / "dashboard-under-load.png")
        await running
        # Every bar carries the id of a request we sent (the node serves only ours).
        bar_ids = set(
            await browser.until(
                "(() => { const ids = [...document.querySelectorAll('#slots rect.bar')]"
                ".map(b => b.getAttribute('data-request-id'));"
                " return ids.length ? ids : null; })()"
            )
        )
        assert bar_ids <= set(SENT), (bar_ids, SENT)
        assert len(bar_ids & set(ids)) >= SLOTS  # this test's, more requests than slots
        # Idle now: the page's KV and queue figures are the node's gauges.
        used = await metric(session, node.url, "tinyserve_kv_blocks_used")
        cached = await metric(session, node.url, "tinyserve_kv_blocks_cached")
        total = await metric(session, node.url, "tinyserve_kv_blocks_capacity")
        waiting = await metric(session, node.url, "tinyserve_requests_waiting")
        expected = {"kv-used": used, "kv-cached": cached, "kv-total": total,
                    "kv-free": total - used - cached, "queue-total": waiting}  # fmt: skip
        for _ in range(100):  # the page shows the engine's state within an update or two
            if await page_figures(browser) == expected:
                break
            await asyncio.sleep(0.1)
        assert await page_figures(browser) == expected
        assert cached > 0  # finished prompts were cached: a figure that is not trivially 0
        outcomes = await browser.evaluate(
            "[...document.querySelectorAll('#outcomes tr')].map(r => r.textContent)"
        )
        assert f"finishedlength{len(ids)}" in outcomes, outcomes  # every one we sent
        # The recent requests table lists ours; clicking a bar shows its timeline.
        recent = await browser.evaluate(
            "[...document.querySelectorAll('#recent tr')].map(r => r.dataset.requestId)"
        )
        assert set(recent) <= set(SENT) and recent
        await click_a_bar(browser, set(SENT))
        await browser.screenshot(tmp_path / "dashboard.png")
    assert (tmp_path / "dashboard.png").stat().st_size > 10_000
    assert not [line for line in browser.console if "rror" in line], browser.console


async def click_a_bar(browser: Browser, ids: set[str]) -> None:
    """Click the middle of the widest bar; the timeline panel shows that request."""
    box = await browser.evaluate(
        "(() => { const bars = [...document.querySelectorAll('#slots rect.bar')];"
        " bars.sort((a, b) => b.getBoundingClientRect().width - a.getBoundingClientRect().width);"
        " const r = bars[0].getBoundingClientRect();"
        " return {x: r.x + r.width / 2, y: r.y + r.height / 2,"
        " id: bars[0].getAttribute('data-request-id')}; })()"
    )
    assert box["id"] in ids
    await browser.click(box["x"], box["y"])
    shown = await browser.until(
        "document.querySelector('#timeline dl') && "
        "document.getElementById('timeline-id').textContent"
    )
    assert shown == box["id"]
    text = await browser.evaluate("document.getElementById('timeline').textContent")
    assert "why it waited" in text and "cache gave it" in text
    assert "prompt from" in text and "computed" in text
    assert f'"request_id": "{box["id"]}"' in text  # the route's JSON, shown in full


async def test_the_page_asks_nothing_of_another_origin(node: Node, browser: Browser) -> None:
    await open_dashboard(browser, node)
    async with aiohttp.ClientSession() as session:
        await load(session, node.url, [], rounds=1)
    await browser.until("document.querySelectorAll('#slots rect.bar').length > 0")
    await browser.evaluate(
        "window.tinyserveDashboard.showRequest("
        "document.querySelector('#slots rect.bar').getAttribute('data-request-id'))"
    )
    requested = list(browser.requests)
    assert requested, "the browser recorded no request at all"
    assert any(url.endswith("/v1/events") for url in requested)
    assert any("/v1/requests/" in url for url in requested)
    outside = [url for url in requested if not url.startswith(node.url + "/")]
    assert not outside, outside
