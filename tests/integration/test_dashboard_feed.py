"""GET /v1/events from a real node: the requests we send show up in the feed, the engine
publishes the feed only while a viewer watches, and it passes through nginx."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import pytest
import zmq
import zmq.asyncio

from tinyserve import feed_protocol, protocol

from .nginx import Nginx, find_nginx
from .node import Node

pytestmark = pytest.mark.integration

SLOTS = 2
MAX_TOKENS = 12


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    flags = ("--slots", str(SLOTS), "--ctx-per-slot", "256", "--max-queue", "16")
    flags += ("--policy", "fifo")
    running = Node(tmp_path_factory.mktemp("feed"), *flags, frontends=2).start()
    yield running
    assert running.stop() == 0


async def feed_events(resp: aiohttp.ClientResponse) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    """(event, data) of an SSE stream; keep-alive comments skipped."""
    buffer = b""
    async for chunk in resp.content.iter_any():
        buffer += chunk
        while b"\n\n" in buffer:
            block, buffer = buffer.split(b"\n\n", 1)
            fields = dict(
                line.split(": ", 1) for line in block.decode().split("\n") if ": " in line
            )
            if "data" in fields:
                yield fields.get("event", "message"), json.loads(fields["data"])


async def send(session: aiohttp.ClientSession, url: str, tenant: str) -> str:
    """One /generate with ``tenant``; returns its request id."""
    body = {"prompt": "Count: 1, 2, 3,", "max_tokens": MAX_TOKENS, "ignore_eos": True,
            "tenant": tenant}  # fmt: skip
    async with session.post(f"{url}/generate", json=body) as resp:
        assert resp.status == 200, await resp.text()
        return resp.headers["X-Request-Id"]


async def test_the_feed_shows_the_requests_we_send(node: Node) -> None:
    tenants = ["alpha", "beta", "gamma", "delta"]
    updates: list[dict[str, Any]] = []
    timeout = aiohttp.ClientTimeout(total=300)
    async with (
        aiohttp.ClientSession(timeout=timeout) as session,
        session.get(f"{node.url}/v1/events") as resp,
    ):
        assert resp.status == 200
        events = feed_events(resp)
        event, hello = await anext(events)
        assert event == "hello" and hello["slots"] == SLOTS
        load = asyncio.gather(*(send(session, node.url, t) for t in tenants))
        ids: set[str] = set()
        finished: set[str] = set()
        async for event, body in events:
            assert event == "update"
            updates.append(body)
            finished |= {e["request_id"] for e in body["events"] if e["kind"] == "finish"}
            if load.done():
                ids = set(load.result())
                if ids <= finished:
                    break
    assert len(ids) == len(tenants)
    events_of = [e for u in updates for e in u["events"] if e["request_id"] in ids]
    grants = {e["request_id"]: e for e in events_of if e["kind"] == "grant"}
    finishes = {e["request_id"]: e for e in events_of if e["kind"] == "finish"}
    assert set(grants) == ids and set(finishes) == ids
    assert {g["tenant"] for g in grants.values()} == set(tenants)
    assert all(f["reason"] == "length" and f["generated"] == MAX_TOKENS for f in finishes.values())
    assert all(f["ttft_ms"] > 0 and f["itl_ms"] > 0 for f in finishes.values())
    in_slots = {s["request_id"] for u in updates for s in u["slots"] if s}
    assert ids <= in_slots  # every request was seen holding a slot
    assert all(len(u["slots"]) == SLOTS for u in updates)
    assert {u["policy"] for u in updates} == {"fifo"}  # the engine's, not a frontend default
    # Two slots, four requests: two waited. A wait of several update intervals shows in the
    # queue of some update (a fast machine may serve the first two within one interval).
    if max(g["wait_ms"] for g in grants.values()) > 400:
        assert any(q["count"] for u in updates for q in u["queue"])
    assert sum(u["batch"].get("generated", 0) for u in updates) >= len(tenants) * MAX_TOKENS
    # Coalesced: never two updates closer than the engine's interval (100 ms).
    stamps = [u["at_ms"] for u in updates]
    assert all(b - a >= 99.0 for a, b in itertools.pairwise(stamps)), stamps
    assert [u["seq"] for u in updates] == sorted(u["seq"] for u in updates)


async def feed_frames(sub: zmq.asyncio.Socket, seconds: float) -> int:
    """How many feed frames the raw subscriber got in ``seconds``."""
    got = 0
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        if await sub.poll(int(left * 1000)):
            topic, _ = await sub.recv_multipart()
            assert topic == feed_protocol.FEED_TOPIC
            got += 1
    return got


async def test_the_engine_publishes_the_feed_only_while_someone_watches(node: Node) -> None:
    ctx = zmq.asyncio.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, feed_protocol.FEED_TOPIC)
    sub.connect(f"ipc://{node.runtime_dir}/engine.out")
    timeout = aiohttp.ClientTimeout(total=300)
    try:
        async with aiohttp.ClientSession(timeout=timeout) as session:
            async with session.get(f"{node.url}/v1/events") as resp:
                assert resp.status == 200
                # Our socket sees the feed a viewer caused (so it is connected and listening).
                assert await feed_frames(sub, 5.0) > 0
            await asyncio.sleep(0.5)  # the last viewer's lease end reaches the engine
            await feed_frames(sub, 0.5)  # drop what was in flight
            # No viewer: the engine serves requests and publishes nothing on the feed.
            load = asyncio.gather(*(send(session, node.url, "quiet") for _ in range(3)))
            assert await feed_frames(sub, 2.0) == 0
            await load
            assert await feed_frames(sub, 0.5) == 0
    finally:
        sub.close()
        ctx.term()


async def test_a_lease_nobody_renews_ends_by_itself(node: Node) -> None:
    # A frontend that crashed sends no FeedLease(0): its lease must run out on its own.
    ctx = zmq.asyncio.Context()
    sub = ctx.socket(zmq.SUB)
    push = ctx.socket(zmq.PUSH)
    for sock in (sub, push):
        sock.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, feed_protocol.FEED_TOPIC)
    sub.connect(f"ipc://{node.runtime_dir}/engine.out")
    push.connect(f"ipc://{node.runtime_dir}/engine.in")
    try:
        await asyncio.sleep(0.5)  # the subscription reaches the engine before the feed starts
        await feed_frames(sub, 0.5)  # whatever another test's viewer left in flight
        await push.send(protocol.encode(feed_protocol.FeedLease("c" * 32, 1.0)))
        assert await feed_frames(sub, 1.0) > 0  # an idle engine still sends one a second
        await asyncio.sleep(1.0)  # the lease (1 s) has run out; nobody renewed it
        await feed_frames(sub, 0.3)
        assert await feed_frames(sub, 2.5) == 0
    finally:
        sub.close()
        push.close()
        ctx.term()


@pytest.mark.skipif(find_nginx() is None, reason="nginx not installed (make test installs it)")
async def test_the_feed_passes_through_nginx(node: Node, tmp_path: Any) -> None:
    nginx = Nginx(tmp_path / "nginx", f"127.0.0.1:{node.port}").start()
    try:
        timeout = aiohttp.ClientTimeout(total=120)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            async with session.get(f"{nginx.url}/v1/events") as resp:
                assert resp.status == 200
                events = feed_events(resp)
                assert (await anext(events))[0] == "hello"
                # An update arrives while the stream stays open: nginx did not buffer it.
                load = asyncio.ensure_future(send(session, nginx.url, "via-nginx"))
                event, body = await asyncio.wait_for(anext(events), 60)
                assert event == "update" and len(body["slots"]) == SLOTS
                await load
            async with session.get(f"{nginx.url}/dashboard") as page:
                assert page.status == 200
                assert "script-src 'self'" in page.headers["Content-Security-Policy"]
    finally:
        with contextlib.suppress(Exception):
            nginx.stop()
