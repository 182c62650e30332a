"""The deadline and srpt policies on a real node: the order in which they grant the one slot,
and deadline_missed, on the real model.

Each test holds the single slot with a long request, queues requests behind it in a known
arrival order, waits until the engine has them all waiting (read from the board), then
cancels the long one: the order the slot goes to them is the policy's alone. The order is
read from their timelines (the tick of each slot grant), not from timing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from tinyserve_native.board import Board

from .node import Node, generate

pytestmark = pytest.mark.integration

PROMPT = "1, 2, 3, 4, 5,"


def start(tmp_path_factory: pytest.TempPathFactory, name: str, *flags: str) -> Node:
    flags = ("--slots", "1", "--ctx-per-slot", "4096", *flags)  # 3000-token requests fit
    return Node(tmp_path_factory.mktemp(name), *flags, frontends=1).start()


@pytest.fixture(scope="module")
def deadline_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    node = start(tmp_path_factory, "deadline", "--policy", "deadline")
    yield node
    assert node.stop() == 0


@pytest.fixture(scope="module")
def srpt_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    # Aging 10 tokens/s: the queued requests arrive within about a second, far less than the
    # 40-token steps between their work, so their order is by work.
    node = start(tmp_path_factory, "srpt", "--policy", "srpt", "--srpt-aging", "10")
    yield node
    assert node.stop() == 0


async def wait_for(node: Node, what: str, check: Any, timeout: float = 120.0) -> None:
    board = Board.attach(str(node.runtime_dir / "board"))
    try:
        deadline = asyncio.get_running_loop().time() + timeout
        while not check(board.snapshot()):
            assert asyncio.get_running_loop().time() < deadline, f"{what}: {board.snapshot()}"
            await asyncio.sleep(0.02)
    finally:
        board.close()


def idle(snap: Any) -> bool:
    return bool(snap.running == 0 and snap.waiting == 0)


async def queued_behind_a_blocker(node: Node, bodies: list[dict[str, Any]]) -> list[Any]:
    """Send ``bodies`` in order while a long request holds the only slot; once all of them
    wait, cancel the long one. Returns their (status, reply) in the order of ``bodies``."""
    await wait_for(node, "idle", idle)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as s:
        blocker = asyncio.create_task(
            generate(s, node.url, prompt=PROMPT, max_tokens=1000, ignore_eos=True)
        )
        await wait_for(node, "the blocker runs", lambda snap: snap.running == 1)
        tasks = []
        for i, body in enumerate(bodies):
            task = asyncio.create_task(generate(s, node.url, timeline=True, **body))
            tasks.append(task)
            await wait_for(
                node, "queued", lambda snap, n=i + 1, t=task: snap.waiting == n or t.done()
            )
            assert not task.done(), task.result()  # it ended instead of waiting
        blocker.cancel()
        return await asyncio.gather(*tasks)


def grant_order(replies: list[Any]) -> list[int]:
    """Indexes of ``replies`` in the order their requests got the slot."""
    for status, body in replies:
        assert status == 200, body
    ticks = [body["timeline"]["slot"]["tick"] for _, body in replies]
    return sorted(range(len(replies)), key=lambda i: ticks[i])


async def test_deadline_grants_the_earliest_deadline_first(deadline_node: Node) -> None:
    minutes = 60_000
    bodies = [
        {"prompt": "No deadline:", "max_tokens": 3},
        {"prompt": "Ten minutes:", "max_tokens": 3, "deadline_ms": 10 * minutes},
        {"prompt": "Two minutes:", "max_tokens": 3, "deadline_ms": 2 * minutes},
        {"prompt": "Five minutes:", "max_tokens": 3, "deadline_ms": 5 * minutes},
    ]
    replies = await queued_behind_a_blocker(deadline_node, bodies)
    assert grant_order(replies) == [2, 3, 1, 0]
    rules = [body["timeline"]["queue"]["rule"] for _, body in replies]
    assert rules[2] == f"deadline deadline_ms={2 * minutes}"
    assert rules[0] == "deadline none"
    assert all(body["finish_reason"] in ("stop", "length") for _, body in replies)


async def test_a_waiting_request_past_its_deadline_ends_deadline_missed(
    deadline_node: Node,
) -> None:
    await wait_for(deadline_node, "idle", idle)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as s:
        blocker = asyncio.create_task(
            generate(s, deadline_node.url, prompt=PROMPT, max_tokens=2000, ignore_eos=True)
        )
        await wait_for(deadline_node, "the blocker runs", lambda snap: snap.running == 1)
        status, body = await generate(
            s, deadline_node.url, prompt="Too late:", max_tokens=5, deadline_ms=200, timeline=True
        )
        still_running = not blocker.done()
        blocker.cancel()
    assert still_running  # so the request could only have waited
    assert status == 200, body
    assert body["finish_reason"] == "deadline_missed"
    assert body["usage"]["completion_tokens"] == 0
    assert body["timeline"]["slot"] is None  # never granted a slot
    assert body["timeline"]["finish"]["ms"] >= 200


async def test_a_running_request_past_its_deadline_keeps_its_tokens(deadline_node: Node) -> None:
    await wait_for(deadline_node, "idle", idle)  # the last test's blocker is gone
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as s:
        status, body = await generate(
            s,
            deadline_node.url,
            prompt=PROMPT,
            max_tokens=3000,
            ignore_eos=True,
            deadline_ms=5000,
        )
        async with s.get(f"{deadline_node.url}/v1/models") as resp:
            model = (await resp.json())["data"][0]["id"]
        async with s.post(
            f"{deadline_node.url}/v1/completions",
            json={
                "model": model,
                "prompt": PROMPT,
                "max_tokens": 3000,
                "ignore_eos": True,
                "deadline_ms": 4000,
            },
        ) as resp:
            openai_status, completion = resp.status, await resp.json()
    assert status == 200, body
    assert body["finish_reason"] == "deadline_missed"
    assert 0 < body["usage"]["completion_tokens"] < 3000
    assert openai_status == 200, completion
    assert completion["choices"][0]["finish_reason"] == "length"  # cut short
    assert 0 < completion["usage"]["completion_tokens"] < 3000


@pytest.mark.parametrize("value", [0, -5, 3_600_001, 1.5, "soon"])
async def test_a_bad_deadline_is_a_400_naming_the_field(deadline_node: Node, value: Any) -> None:
    async with aiohttp.ClientSession() as s:
        status, body = await generate(s, deadline_node.url, prompt="Hi", deadline_ms=value)
    assert status == 400, body
    assert "deadline_ms" in body["error"]["message"]


async def test_srpt_grants_the_smallest_work_first(srpt_node: Node) -> None:
    bodies = [{"prompt": PROMPT, "max_tokens": n} for n in (160, 40, 120, 8, 80)]
    replies = await queued_behind_a_blocker(srpt_node, bodies)
    assert grant_order(replies) == [3, 1, 4, 2, 0]
    rule = replies[3][1]["timeline"]["queue"]["rule"]
    assert rule.startswith("shortest work=") and rule.endswith("aging=10")
