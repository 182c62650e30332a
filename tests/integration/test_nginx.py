"""A real nginx (config rendered from deploy/nginx's template) in front of real nodes.

Node A: one engine with a single slot and a queue of two (easy to fill), two frontends.
Node B: one engine, one frontend. ``one_node`` balances A's two frontends; ``two_nodes`` has
one frontend of each node, so a request A's admission refuses must be served by B.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from tests.integration.nginx import Nginx, find_nginx
from tests.integration.units import TimedStream, UnitNode, post_json, timed_stream, until

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(find_nginx() is None, reason="nginx not installed (make test installs it)"),
]

COUNTING = "1, 2, 3, 4, 5,"  # with ignore_eos below: only max_tokens ends these
# Node A's queue. Not 1: a frontend's board slot shows a request it sent as pending until its
# next tick (0.25 s), even once the engine queued it, so back-to-back requests would be
# counted twice and refused with a queue of one.
A_QUEUE = 2


@dataclass
class Site:
    a: UnitNode
    b: UnitNode
    one_node: Nginx
    two_nodes: Nginx


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    root = tmp_path_factory.mktemp("nginx")
    a = UnitNode(root / "a", 2, engine_flags=("--slots", "1", "--max-queue", str(A_QUEUE)))
    b = UnitNode(root / "b", 1)
    nginxes: list[Nginx] = []
    try:
        a.start()
        b.start()
        one = Nginx(root / "nginx-one", f"127.0.0.1:{a.ports[0]},{a.ports[1]}").start()
        nginxes.append(one)
        two = Nginx(
            root / "nginx-two", f"127.0.0.1:{a.ports[0]}", f"127.0.0.1:{b.ports[0]}"
        ).start()
        nginxes.append(two)
        yield Site(a, b, one, two)
    finally:
        for server in nginxes:
            server.stop()
        codes = {**a.stop(), **{f"b/{k}": v for k, v in b.stop().items()}}
    assert all(code == 0 for code in codes.values()), codes


@contextlib.asynccontextmanager
async def node_full(node: UnitNode) -> AsyncIterator[None]:
    """Fill node A (one slot, a queue of ``A_QUEUE``): one long request running, the queue
    full of others."""
    body = {"prompt": COUNTING, "max_tokens": 1000, "ignore_eos": True}
    fillers: list[asyncio.Task[TimedStream]] = []

    def settled(running: int, waiting: int) -> bool:
        # Admission counts requests a frontend sent but the engine has not taken yet, as the
        # frontend last wrote them to its board slot: wait for those figures to settle too.
        snap = node.snapshot()
        pending = sum(slot.pending_requests for slot in node.frontend_slots())
        done = [task for task in fillers if task.done()]
        assert not done, f"a filler ended early: {done[0].result()}"
        return (snap.running, snap.waiting, pending) == (running, waiting, 0)

    async with aiohttp.ClientSession() as session:
        try:
            for waiting in range(A_QUEUE + 1):
                fillers.append(asyncio.create_task(timed_stream(session, node.urls[0], body)))
                await until(lambda w=waiting: settled(1, w), 30, "the node to fill")
            yield
        finally:
            for task in fillers:
                task.cancel()
            await asyncio.gather(*fillers, return_exceptions=True)
    # Closing the connections cancels both in the engine.
    idle = lambda: node.snapshot().running == node.snapshot().waiting == 0  # noqa: E731
    await until(idle, 30, "the node to empty")


async def test_requests_spread_over_both_frontends(site: Site) -> None:
    served_by = []
    async with aiohttp.ClientSession() as session:
        for i in range(6):
            status, headers, reply = await post_json(
                session, site.one_node.url, prompt=f"Say {i}", max_tokens=2
            )
            assert status == 200, reply
            served_by.append(int(headers["X-TinyServe-Frontend"]))
    assert set(served_by) == {front.pid for front in site.a.fronts}


async def test_first_sse_token_arrives_before_the_stream_ends(site: Site) -> None:
    seen = TimedStream()
    running_at_first_event: list[int] = []

    async def watch() -> None:
        await until(lambda: bool(seen.events), 60, "the first event")
        running_at_first_event.append(site.a.snapshot().running)

    async with aiohttp.ClientSession() as session:
        watcher = asyncio.create_task(watch())
        body = {"prompt": COUNTING, "max_tokens": 64, "ignore_eos": True}
        await timed_stream(session, site.one_node.url, body, seen)
        await watcher
    assert seen.status == 200 and seen.final is not None
    assert seen.final["finish_reason"] == "length"
    # Unbuffered: the first event reached the client while the engine was still generating,
    # and the events arrived spread over the generation, not in one burst at its end.
    assert running_at_first_event == [1]
    first, last = seen.events[0][0], seen.events[-1][0]
    assert last - first > 0.2, f"events arrived within {last - first:.3f} s"


async def test_a_503_passes_through_with_its_retry_after(site: Site) -> None:
    async with node_full(site.a), aiohttp.ClientSession() as session:
        status, headers, reply = await post_json(
            session, site.one_node.url, prompt="Hi", max_tokens=4
        )
    assert status == 503, reply
    assert reply["error"]["reason"] == "queue_full"
    assert int(headers["Retry-After"]) >= 1
    # nginx asked both frontends of the node before giving up with the last answer.
    last = site.one_node.access_lines()[-1]
    assert "upstream_status=503, 503" in last, last


async def test_a_request_refused_by_one_node_is_served_by_the_other(site: Site) -> None:
    a_frontend = f"127.0.0.1:{site.a.ports[0]}"
    async with node_full(site.a), aiohttp.ClientSession() as session:
        replies = [
            await post_json(session, site.two_nodes.url, prompt=f"Say {i}", max_tokens=2)
            for i in range(4)
        ]
    assert [status for status, _, _ in replies] == [200] * 4, replies
    assert {int(h["X-TinyServe-Frontend"]) for _, h, _ in replies} == {site.b.fronts[0].pid}
    # Round robin sent some of them to node A first: refused there, retried on B.
    retried = [line for line in site.two_nodes.access_lines() if "upstream_status=503, 200" in line]
    assert retried, site.two_nodes.access_lines()
    assert all(f"upstream={a_frontend}, " in line for line in retried)


async def test_trace_context_reaches_the_frontends(tmp_path: Path) -> None:
    seen: list[dict[str, str]] = []

    async def echo(request: web.Request) -> web.Response:
        seen.append(dict(request.headers))
        return web.json_response({})

    app = web.Application()
    app.router.add_post("/generate", echo)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    server = await asyncio.to_thread(lambda: Nginx(tmp_path, f"127.0.0.1:{port}").start())
    trace: dict[str, Any] = {
        "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "tracestate": "vendor=opaque",
    }
    try:
        async with (
            aiohttp.ClientSession() as session,
            session.post(f"{server.url}/generate", json={}, headers=trace) as resp,
        ):
            assert resp.status == 200
    finally:
        server.stop()
        await runner.cleanup()
    assert seen and {k: seen[0][k] for k in trace} == trace
