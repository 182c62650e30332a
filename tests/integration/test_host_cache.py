"""The prefix cache in host memory and kept across restarts, on real nodes.

A node with one slot serves other conversations after a first turn, so the slot no longer
keeps it; its next turn is then served from the prefix cache in host memory, with what the
slot would have given. Stopped (SIGTERM), a node writes its cache to ``--cache-dir``; a node
started on that directory serves the next turn from the KV it read, with the output of a node
that never stopped; damaged files are skipped with a log line and the node serves as a cold
one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from .node import Node, generate

pytestmark = pytest.mark.integration

FLAGS = ("--slots", "1", "--ctx-per-slot", "512", "--frontends", "1")
SYSTEM = (
    "You are a careful assistant for a small museum of maritime history. Answer visitors' "
    "questions about ships, harbours, lighthouses and navigation in two short sentences. "
)
TURN1 = f"{SYSTEM}\nVisitor: Why were lighthouses painted with stripes?\nGuide:"
TURN2_USER = "\nVisitor: And how far could their light be seen?\nGuide:"


def greedy(prompt: str, max_tokens: int = 12) -> dict[str, Any]:
    return {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "timeline": True}


async def ask(url: str, body: dict[str, Any]) -> dict[str, Any]:
    async with aiohttp.ClientSession() as s:
        status, reply = await generate(s, url, **body)
    assert status == 200, reply
    return reply  # type: ignore[no-any-return]


def start(workdir: Path, *flags: str) -> Node:
    workdir.mkdir(parents=True, exist_ok=True)
    return Node(workdir, *FLAGS, *flags, frontends=1).start()


@pytest.fixture(scope="module")
def cold_turn2(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, dict[str, Any]]]:
    """What a node that never stopped answers: turn 1, then turn 2 from its slot's cells; its
    cells of the type ``request.param`` names (f16 unless a test says)."""
    kv_type = getattr(request, "param", "f16")
    node = start(tmp_path_factory.mktemp(f"never_stopped_{kv_type}"), "--kv-type", kv_type)
    try:
        first = asyncio.run(ask(node.url, greedy(TURN1)))
        turn2 = TURN1 + first["text"] + TURN2_USER
        second = asyncio.run(ask(node.url, greedy(turn2)))
        assert second["usage"]["cached_tokens"] > 0
        yield turn2, second
    finally:
        assert node.stop() == 0


@pytest.mark.parametrize("cold_turn2", ["f16", "q8_0"], indirect=True)
async def test_a_conversation_its_slot_forgot_comes_back_from_host_memory(
    tmp_path: Path, cold_turn2: tuple[str, dict[str, Any]], request: pytest.FixtureRequest
) -> None:
    """The one slot serves other conversations between its turns; the next turn gets its
    history back from host memory: as many tokens as the slot would have kept, and the same
    text. Quantized cells (``--kv-type q8_0``) are cut into blocks and joined back as f16's."""
    turn2, expected = cold_turn2
    kv_type = request.node.callspec.params["cold_turn2"]
    node = start(tmp_path, "--kv-type", kv_type)
    try:
        first = await ask(node.url, greedy(TURN1))
        for i in range(3):
            await ask(node.url, greedy(f"Topic {i}.\nVisitor: hello {i}\nGuide:", 4))
        assert TURN1 + first["text"] + TURN2_USER == turn2
        second = await ask(node.url, greedy(turn2))
        restore = second["timeline"].get("restore")
        assert restore is not None, second["timeline"]
        assert restore["tier"] == "host"
        assert restore["tokens"] == second["usage"]["cached_tokens"]
        usage = second["usage"]
        assert second["timeline"]["prompt_from"] == {
            "slot": 0, "host": restore["tokens"], "disk": 0, "leader": 0,
            "computed": usage["prompt_tokens"] - usage["cached_tokens"]}  # fmt: skip
        assert second["usage"]["cached_tokens"] == expected["usage"]["cached_tokens"]
        assert second["text"] == expected["text"]
        async with aiohttp.ClientSession() as s, s.get(node.url + "/metrics") as resp:
            text = await resp.text()
        hit = [
            line
            for line in text.splitlines()
            if line.startswith('tinyserve_prefix_cache_hit_tokens_total{tier="host"}')
        ]
        assert hit and float(hit[0].split()[-1]) >= restore["tokens"], hit
        assert f"MiB of {kv_type};" in node.log()
    finally:
        assert node.stop() == 0


async def test_a_restarted_node_answers_from_the_kv_it_kept(
    tmp_path: Path, cold_turn2: tuple[str, dict[str, Any]]
) -> None:
    turn2, expected = cold_turn2
    cache_dir = tmp_path / "cache"
    node = start(tmp_path / "before", "--cache-dir", str(cache_dir))
    try:
        first = await ask(node.url, greedy(TURN1))
        assert TURN1 + first["text"] + TURN2_USER == turn2
    finally:
        assert node.stop() == 0
    assert "prefix cache written" in node.log()
    assert list(cache_dir.glob("prefix-*.bin"))
    node = start(tmp_path / "after", "--cache-dir", str(cache_dir))
    try:
        second = await ask(node.url, greedy(turn2))
    finally:
        assert node.stop() == 0
    assert second["usage"]["cached_tokens"] == expected["usage"]["cached_tokens"] > 0
    restore = second["timeline"]["restore"]
    assert (restore["tier"], restore["tokens"]) == ("disk", second["usage"]["cached_tokens"])
    assert second["text"] == expected["text"]


async def test_damaged_cache_files_are_skipped_and_the_node_serves(
    tmp_path: Path, cold_turn2: tuple[str, dict[str, Any]]
) -> None:
    turn2, _ = cold_turn2
    cache_dir = tmp_path / "cache"
    node = start(tmp_path / "before", "--cache-dir", str(cache_dir))
    try:
        await ask(node.url, greedy(TURN1))
    finally:
        assert node.stop() == 0
    [written] = cache_dir.glob("prefix-*.bin")
    data = written.read_bytes()
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0x40
    written.write_bytes(bytes(flipped))
    written.with_name(written.name.replace("-0000.bin", "-0001.bin")).write_bytes(data[:-100])
    node = start(tmp_path / "after", "--cache-dir", str(cache_dir))
    try:
        second = await ask(node.url, greedy(turn2))
    finally:
        assert node.stop() == 0
    skipped = [line for line in node.log().splitlines() if "prefix cache file skipped" in line]
    assert len(skipped) == 2, skipped
    assert any("checksum mismatch" in line for line in skipped)
    assert any("truncated" in line for line in skipped)
    assert second["usage"]["cached_tokens"] == 0  # nothing was read: prefilled cold
    assert "restore" not in second["timeline"]
    assert second["finish_reason"] in {"length", "stop"}
