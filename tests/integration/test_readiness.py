"""``/ready`` says 200 only when the whole node can serve, with real processes and the model.

``tinyserve serve --frontends 2``: both frontends share one port (SO_REUSEPORT), and the
kernel hands each new connection to either. A request sent the moment ``/ready`` first says
200 must be served whichever frontend takes it: at start, and after the engine's ``kill -9``.
Every probe and every request opens a connection of its own, as separate clients would (one
kept-alive connection would keep asking the same frontend). ``bench/readiness.py`` makes the
full measurement (20 starts).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import aiohttp
import pytest

from tests.integration.node import Node

pytestmark = pytest.mark.integration

SMALL = ("--ctx-per-slot", "256")  # a small KV cache: the model loads faster
STARTS = 3
KILLS = 2
REQUESTS = 12
BODY = {"prompt": "Hi", "max_tokens": 1}
READY_WITHIN_S = 180.0


async def status_of(session: aiohttp.ClientSession, method: str, url: str) -> tuple[int, str]:
    """The status and the error reason of one request; 0 when nobody answered."""
    try:
        async with session.request(method, url, json=BODY if method == "POST" else None) as resp:
            body = await resp.json(content_type=None)
            return resp.status, (body.get("error") or {}).get("reason", "")
    except aiohttp.ClientConnectionError:
        return 0, "no answer"


async def until_ready(session: aiohttp.ClientSession, url: str, ready: bool) -> None:
    """Ask ``/ready`` until it says 200 (``ready``) or anything else (not ``ready``)."""
    deadline = time.monotonic() + READY_WITHIN_S
    while ((await status_of(session, "GET", f"{url}/ready"))[0] == 200) != ready:
        assert time.monotonic() < deadline, f"/ready never became {'' if ready else 'not '}ready"
        await asyncio.sleep(0.01)


async def burst(session: aiohttp.ClientSession, url: str) -> list[tuple[int, str]]:
    """``REQUESTS`` /generate requests at once, each on its own connection."""
    return await asyncio.gather(
        *(status_of(session, "POST", f"{url}/generate") for _ in range(REQUESTS))
    )


def fresh_connections() -> aiohttp.ClientSession:
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(force_close=True),
        timeout=aiohttp.ClientTimeout(total=60),
    )


async def test_requests_sent_the_moment_ready_says_200_are_served(tmp_path: Path) -> None:
    for start in range(STARTS):
        workdir = tmp_path / f"start{start}"
        workdir.mkdir()
        node = Node(workdir, *SMALL, frontends=2).launch()
        try:
            async with fresh_connections() as session:
                await until_ready(session, node.url, ready=True)
                replies = await burst(session, node.url)
            node.wait_ready()
        finally:
            assert node.stop() == 0
        assert replies == [(200, "")] * REQUESTS, f"start {start}: {replies}"
        assert node.log().count(f"ready on {node.url}") == 1


async def test_after_an_engine_kill_ready_says_200_only_when_the_node_serves(
    tmp_path: Path,
) -> None:
    node = Node(tmp_path, *SMALL, frontends=2).start()
    try:
        async with fresh_connections() as session:
            for kill in range(KILLS):
                engine = node.engine_pid()
                os.kill(engine, signal.SIGKILL)
                await until_ready(session, node.url, ready=False)
                await until_ready(session, node.url, ready=True)
                replies = await burst(session, node.url)
                assert replies == [(200, "")] * REQUESTS, f"kill {kill}: {replies}"
                assert node.engine_pid() != engine
    finally:
        assert node.stop() == 0
    # Once at start, once each time the node is whole again.
    assert node.log().count(f"ready on {node.url}") == 1 + KILLS
