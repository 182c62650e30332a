"""GET /metrics on a real node: either frontend returns the same node-wide figures."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from .node import Node
from .units import UnitNode, post_json

pytestmark = pytest.mark.integration

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]
SHARED_PREFIX = (
    "Here is a list of numbers written out in words, one per line, starting from one and "
    "going up without skipping any of them, until the number"
)
MIN_REQUESTS = 6
MAX_REQUESTS = 40  # SO_REUSEPORT spreads connections by hash: both frontends answer long before
# Figures that count all N requests, from whichever process writes them.
NODE_WIDE = (
    "tinyserve_prompt_tokens_total",
    "tinyserve_generation_tokens_total",
    "tinyserve_cached_prompt_tokens_total",
    "tinyserve_time_to_first_token_seconds_count",
    "tinyserve_request_duration_seconds_count",
    "tinyserve_request_generation_tokens_sum",
    "tinyserve_request_prompt_tokens_sum",
    "tinyserve_queue_wait_seconds_count",
    "tinyserve_prefix_cache_lookups_total",
)


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    running = Node(tmp_path_factory.mktemp("metrics"), "--slots", "4", frontends=2).start()
    yield running
    assert running.stop() == 0


def parse(text: str) -> Samples:
    found: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            found[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return found


def get(found: Samples, name: str, **labels: str) -> float:
    return found.get((name, tuple(sorted(labels.items()))), 0.0)


def total(found: Samples, name: str, **labels: str) -> float:
    """Sum over every series of ``name`` that has ``labels``."""
    want = set(labels.items())
    return sum(v for (n, ls), v in found.items() if n == name and want <= set(ls))


async def fresh_connection(s: aiohttp.ClientSession, method: str, url: str, **kw: Any) -> Any:
    async with s.request(method, url, **kw) as resp:
        body = await resp.json() if method == "POST" else await resp.text()
        return resp.status, resp.headers["X-TinyServe-Frontend"], body


async def send_until_both_frontends_served(url: str) -> tuple[list[dict[str, Any]], set[str]]:
    """Requests until both frontends answered some (and at least MIN_REQUESTS): their usages."""
    usages: list[dict[str, Any]] = []
    pids: set[str] = set()
    # A new connection per request: SO_REUSEPORT picks the frontend per connection.
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as s:
        while len(usages) < MIN_REQUESTS or len(pids) < 2:
            assert len(usages) < MAX_REQUESTS, f"one frontend answered everything: {pids}"
            i = len(usages)
            prompt = f"{SHARED_PREFIX} {i}."  # the shared full blocks are reused from the cache
            body = {"prompt": prompt, "max_tokens": 3 + i % 4, "ignore_eos": True}
            status, pid, reply = await fresh_connection(s, "POST", f"{url}/generate", json=body)
            assert status == 200, reply
            assert reply["finish_reason"] == "length"
            usages.append(reply["usage"])
            pids.add(pid)
    return usages, pids


async def idle_scrapes(url: str, pids: set[str]) -> dict[str, Samples]:
    """One scrape per frontend, taken once the engine's gauges show it idle."""
    scrapes: dict[str, Samples] = {}
    deadline = time.monotonic() + 60
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as s:
        while set(scrapes) != pids:
            assert time.monotonic() < deadline, f"scraped only {set(scrapes)} of {pids}"
            status, pid, text = await fresh_connection(s, "GET", f"{url}/metrics")
            assert status == 200
            found = parse(text)
            if get(found, "tinyserve_requests_running") == 0:
                scrapes[pid] = found
            await asyncio.sleep(0.05)
    return scrapes


async def test_every_frontend_reports_the_whole_node(node: Node) -> None:
    usages, pids = await send_until_both_frontends_served(node.url)
    n = len(usages)
    scrapes = await idle_scrapes(node.url, pids)
    expected = {
        "tinyserve_prompt_tokens_total": sum(u["prompt_tokens"] for u in usages),
        "tinyserve_generation_tokens_total": sum(u["completion_tokens"] for u in usages),
        "tinyserve_cached_prompt_tokens_total": sum(u["cached_tokens"] for u in usages),
        "tinyserve_request_generation_tokens_sum": sum(u["completion_tokens"] for u in usages),
        "tinyserve_request_prompt_tokens_sum": sum(u["prompt_tokens"] for u in usages),
    }
    for pid, found in scrapes.items():
        assert total(found, "tinyserve_requests_total") == n, pid
        assert get(found, "tinyserve_requests_total", finish_reason="length", code="200") == n
        for name in NODE_WIDE:
            assert get(found, name) == expected.get(name, n), (pid, name)
        assert total(found, "tinyserve_scheduler_decisions_total", policy="wfq") == n
        assert total(found, "tinyserve_batch_requests_count") >= 1
        # Engine gauges of an idle engine, whoever is asked.
        assert get(found, "tinyserve_kv_blocks_capacity") == 4096 // 16
        assert get(found, "tinyserve_slots") == 4
        for gauge in ("requests_running", "requests_waiting", "kv_blocks_used"):
            assert get(found, f"tinyserve_{gauge}") == 0, (pid, gauge)
        assert get(found, "tinyserve_kv_blocks_cached") > 0  # finished prompts stay cached
        # Each frontend's own view of the engine, one series per frontend process.
        up = {
            dict(ls)["pid"]: v for (name, ls), v in found.items() if name == "tinyserve_engine_up"
        }
        assert up == dict.fromkeys(pids, 1.0)
    first, second = scrapes.values()
    for name in (*NODE_WIDE, "tinyserve_kv_blocks_cached", "tinyserve_requests_total"):
        assert total(first, name) == total(second, name), name


def test_metrics_files_live_in_the_runtime_dir(node: Node) -> None:
    directory = Path(node.runtime_dir) / "metrics"
    assert (directory.stat().st_mode & 0o777) == 0o700
    assert any(directory.glob("counter_*.db"))


async def scrape_until(url: str, holds: Callable[[Samples], bool], what: str) -> Samples:
    """Scrape ``url`` until ``holds`` is true of its figures (30 s at most)."""
    deadline = time.monotonic() + 30
    async with aiohttp.ClientSession() as s:
        while True:
            async with s.get(f"{url}/metrics") as resp:
                found = parse(await resp.text())
            if holds(found):
                return found
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            await asyncio.sleep(0.1)


def up_by_pid(found: Samples) -> dict[int, float]:
    return {int(dict(ls)["pid"]): v for (n, ls), v in found.items() if n == "tinyserve_engine_up"}


async def test_dead_processes_leave_gauges_but_keep_their_counts(tmp_path: Path) -> None:
    node = UnitNode(tmp_path, 2, engine_flags=("--slots", "2")).start()
    url = node.urls[0]
    fronts = [front.pid for front in node.fronts]
    generated = "tinyserve_generation_tokens_total"
    try:
        async with aiohttp.ClientSession() as s:
            for front_url in node.urls:
                assert (await post_json(s, front_url, prompt="Hi", max_tokens=3))[0] == 200
        before = await scrape_until(
            url, lambda f: up_by_pid(f) == dict.fromkeys(fronts, 1.0), "both frontends up"
        )
        assert get(before, "tinyserve_kv_blocks_capacity") > 0
        assert total(before, "tinyserve_requests_total") == 2

        # The engine dies: each frontend reports it down, and its gauges go (a frontend marked
        # its pid dead); its counters still count.
        node.engine.kill9()
        down = await scrape_until(
            url,
            lambda f: (
                up_by_pid(f) == dict.fromkeys(fronts, 0.0)
                and ("tinyserve_kv_blocks_capacity", ()) not in f
            ),
            "engine down and its gauges gone",
        )
        assert get(down, generated) == get(before, generated) > 0

        # A new engine: gauges back, counts go on from the dead engine's.
        node.engine.start().wait_for("READY=1")
        await scrape_until(url, lambda f: get(f, "tinyserve_engine_up", pid=str(fronts[0])) == 1,
                           "engine up again")  # fmt: skip
        async with aiohttp.ClientSession() as s:
            status, _, reply = await post_json(s, url, prompt="Hi", max_tokens=3)
        assert status == 200, reply
        new_tokens = reply["usage"]["completion_tokens"]
        # The engine counts a tick's tokens after it sent them: the reply can reach us first
        # (a fresh clone's run scraped 2 of the 3), so wait for the count, then check it.
        after = await scrape_until(
            url,
            lambda f: (
                get(f, "tinyserve_kv_blocks_capacity") > 0
                and get(f, generated) >= get(before, generated) + new_tokens
            ),
            "new engine's gauges and counts",
        )
        assert get(after, generated) == get(before, generated) + new_tokens

        # A frontend dies: the engine reaps it and its engine_up series goes.
        node.fronts[1].kill9()
        await scrape_until(url, lambda f: set(up_by_pid(f)) == {fronts[0]}, "frontend 1 gone")
    finally:
        node.stop()


async def test_frontend_that_dies_before_greeting_a_new_engine_loses_its_gauges(
    tmp_path: Path,
) -> None:
    """The race behind one CI failure: a frontend killed after a new engine started but before
    its Hello reached it. Stopped (SIGSTOP) across the restart, it cannot greet in time."""
    node = UnitNode(tmp_path, 2, engine_flags=("--slots", "2")).start()
    url = node.urls[0]
    fronts = [front.pid for front in node.fronts]
    try:
        await scrape_until(url, lambda f: set(up_by_pid(f)) == set(fronts), "both frontends up")
        node.engine.kill9()
        os.kill(fronts[1], signal.SIGSTOP)
        node.engine.start().wait_for("READY=1")
        await scrape_until(url, lambda f: get(f, "tinyserve_engine_up", pid=str(fronts[0])) == 1,
                           "engine up again")  # fmt: skip
        node.fronts[1].kill9()  # SIGKILL ends a stopped process too
        await scrape_until(url, lambda f: set(up_by_pid(f)) == {fronts[0]}, "frontend 1 gone")
    finally:
        node.stop()
