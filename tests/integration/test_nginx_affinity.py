"""Session affinity (``render_nginx.py --affinity``): two real nodes behind a real nginx.

Node A runs an engine and two frontends, node B an engine and one, so the ring carries the
weights a deployment with unequal nodes gets (each of A's frontends 1, B's one 2). Which
node served a request is read from the nodes themselves, never from nginx's config: the
frontend pid in ``X-TinyServe-Frontend``, the prefix cache's ``usage.cached_tokens`` and each
node's own ``/metrics`` request count.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest

from tests.integration.nginx import Nginx, find_nginx
from tests.integration.units import UnitNode

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(find_nginx() is None, reason="nginx not installed (make test installs it)"),
]

SESSION = "X-Session-Id"
# About 30 tokens: at least one full 16-token block that a later turn can find cached.
OPENING = (
    "The old lighthouse keeper climbed the narrow stone stairs every evening to light the "
    "great brass lamp above the harbour"
)
BLOCK = 16


@dataclass
class Served:
    """One 200 reply: the node whose frontend answered, and what its prefix cache gave."""

    node: str
    cached: int
    text: str


@dataclass
class Pair:
    a: UnitNode
    b: UnitNode
    nginx: Nginx
    killed: set[str] = field(default_factory=set)

    def nodes(self) -> dict[str, UnitNode]:
        return {"a": self.a, "b": self.b}

    def node_of(self, frontend_pid: int) -> str:
        for name, node in self.nodes().items():
            if frontend_pid in {front.pid for front in node.fronts}:
                return name
        raise AssertionError(f"pid {frontend_pid} is no frontend of either node")

    def kill(self, name: str) -> None:
        """SIGKILL every process of a node, the engine first, as a machine that dies."""
        node = self.nodes()[name]
        for proc in (node.engine, *node.fronts):
            proc.kill9()
        self.killed.add(name)


def frontend_list(node: UnitNode) -> str:
    return "127.0.0.1:" + ",".join(str(port) for port in node.ports)


@contextlib.contextmanager
def two_nodes(root: Path) -> Iterator[Pair]:
    a = UnitNode(root / "a", 2)
    b = UnitNode(root / "b", 1)
    server: Nginx | None = None
    pair: Pair | None = None
    try:
        a.start()
        b.start()
        options = ["--affinity"]
        server = Nginx(root / "nginx", frontend_list(a), frontend_list(b), options=options)
        pair = Pair(a, b, server.start())
        yield pair
    finally:
        if server is not None:
            server.stop()
        codes = {f"{name}/{proc}": code for name, node in (("a", a), ("b", b))
                 for proc, code in node.stop().items()}  # fmt: skip
    killed = pair.killed if pair is not None else set()
    survivors = {k: v for k, v in codes.items() if k.split("/")[0] not in killed}
    assert all(code == 0 for code in survivors.values()), survivors


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    with two_nodes(tmp_path_factory.mktemp("affinity")) as running:
        yield running


async def ask(
    http: aiohttp.ClientSession, pair: Pair, prompt: str, session_id: str | None, max_tokens: int
) -> Served:
    """POST /generate through nginx, with ``session_id`` in the session header if not None."""
    headers = {} if session_id is None else {SESSION: session_id}
    body = {"prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True}
    async with http.post(f"{pair.nginx.url}/generate", json=body, headers=headers) as resp:
        reply = await resp.json(content_type=None)
        assert resp.status == 200, reply
        node = pair.node_of(int(resp.headers["X-TinyServe-Frontend"]))
    return Served(node, reply["usage"]["cached_tokens"], reply["text"])


async def chat(
    http: aiohttp.ClientSession, pair: Pair, session_id: str, turns: int, start: str = ""
) -> tuple[list[Served], str]:
    """``turns`` turns of one conversation, each prompt the whole conversation so far."""
    prompt = start or f"Conversation {session_id}: {OPENING}"
    served = []
    for turn in range(turns):
        reply = await ask(http, pair, prompt, session_id, max_tokens=4)
        served.append(reply)
        prompt += f"{reply.text} And then, turn {turn + 1}:"
    return served, prompt


async def requests_counted(http: aiohttp.ClientSession, node: UnitNode) -> float:
    """The node's own count of finished requests (every label set of
    ``tinyserve_requests_total``, all its processes merged)."""
    async with http.get(f"{node.urls[0]}/metrics") as resp:
        assert resp.status == 200
        text = await resp.text()
    return sum(
        float(line.rpartition(" ")[2])
        for line in text.splitlines()
        if line.startswith("tinyserve_requests_total{")
    )


async def test_a_conversation_stays_on_one_node_and_hits_its_cache(pair: Pair) -> None:
    turns = 5
    async with aiohttp.ClientSession() as http:
        before = {name: await requests_counted(http, n) for name, n in pair.nodes().items()}
        served, _ = await chat(http, pair, "pinned", turns)
        home = served[0].node
        assert [s.node for s in served] == [home] * turns, served
        # Nobody had seen the opening; every later turn found the earlier ones cached.
        assert served[0].cached == 0, served
        assert all(s.cached >= BLOCK for s in served[1:]), served
        # The nodes' own counters: all five on the home node, none on the other.
        other = "b" if home == "a" else "a"
        deadline = time.monotonic() + 10
        while await requests_counted(http, pair.nodes()[home]) - before[home] < turns:
            assert time.monotonic() < deadline, "the home node never counted the turns"
            await asyncio.sleep(0.1)
        assert await requests_counted(http, pair.nodes()[home]) - before[home] == turns
        assert await requests_counted(http, pair.nodes()[other]) == before[other]


async def test_session_ids_spread_over_both_nodes_and_each_keeps_its_node(pair: Pair) -> None:
    ids = [f"user-{i}" for i in range(16)]  # all on one node: odds of 2 in 65536
    async with aiohttp.ClientSession() as http:
        rounds = [
            [(await ask(http, pair, f"Hello from {sid}", sid, max_tokens=1)).node for sid in ids]
            for _ in range(2)
        ]
    assert rounds[0] == rounds[1], rounds
    assert set(rounds[0]) == {"a", "b"}, rounds[0]


@pytest.mark.parametrize("session_id", [None, ""], ids=["no header", "empty header"])
async def test_requests_without_a_session_take_turns(pair: Pair, session_id: str | None) -> None:
    async with aiohttp.ClientSession() as http:
        frontends = set()
        for i in range(6):
            body = {"prompt": f"Say {i}", "max_tokens": 1}
            headers = {} if session_id is None else {SESSION: session_id}
            async with http.post(f"{pair.nginx.url}/generate", json=body, headers=headers) as r:
                assert r.status == 200, await r.text()
                frontends.add(int(r.headers["X-TinyServe-Frontend"]))
    # Round robin visits all three frontends; a hash of one (empty) key would pick one.
    assert frontends == {f.pid for node in pair.nodes().values() for f in node.fronts}
    assert {pair.node_of(pid) for pid in frontends} == {"a", "b"}


@dataclass
class Attempt:
    started: float
    ended: float
    status: int  # -1: the connection broke


async def background(http: aiohttp.ClientSession, pair: Pair, log: list[Attempt]) -> None:
    """Requests one after another, each of its own session, until cancelled."""
    i = 0
    while True:
        started = time.monotonic()
        body = {"prompt": f"Background request {i}", "max_tokens": 2}
        try:
            headers = {SESSION: f"background-{i % 8}"}
            async with http.post(f"{pair.nginx.url}/generate", json=body, headers=headers) as r:
                await r.read()
                status = r.status
        except aiohttp.ClientError:
            status = -1
        log.append(Attempt(started, time.monotonic(), status))
        i += 1


async def test_a_dead_node_s_sessions_move_to_the_other_node_and_stay(tmp_path: Path) -> None:
    with two_nodes(tmp_path) as pair:
        async with aiohttp.ClientSession() as http:
            before, prompt = await chat(http, pair, "doomed", 2)
            home = before[0].node
            assert before[1].node == home and before[1].cached >= BLOCK, before
            log: list[Attempt] = []
            traffic = asyncio.create_task(background(http, pair, log))
            while len(log) < 4:
                await asyncio.sleep(0.05)
            killing = time.monotonic()
            pair.kill(home)
            dead = time.monotonic()
            while len([a for a in log if a.started > dead]) < 8:
                assert not traffic.done(), traffic
                await asyncio.sleep(0.05)
            traffic.cancel()
            await asyncio.gather(traffic, return_exceptions=True)
            after, _ = await chat(http, pair, "doomed", 2, start=prompt)
    # The next turn went to the other node, which had never seen the conversation; the turn
    # after it found it there: the session settled on the survivor.
    survivor = "b" if home == "a" else "a"
    assert [s.node for s in after] == [survivor] * 2, after
    assert after[0].cached == 0 and after[1].cached >= BLOCK, after
    # No request lost but one in flight at the kill: every request sent after it got a 200.
    assert all(a.status == 200 for a in log if a.started > dead), log
    assert all(a.status == 200 for a in log if a.ended < killing), log
    assert [a for a in log if a.started > dead], log
