"""``--kv-layout slots`` on a real node: a request may fill its slot's cells, not the context,
and a slot's kept cells serve the next prompt that starts the same way."""

from __future__ import annotations

from collections.abc import Iterator

import aiohttp
import pytest

from .node import Node, generate
from .test_prefix_cache import PROMPT

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    flags = ("--kv-layout", "slots", "--ctx", "1024", "--slots", "4")
    running = Node(tmp_path_factory.mktemp("kv_layout"), *flags).start()
    yield running
    assert running.stop() == 0


async def test_a_longer_prompt_reuses_the_cells_its_start_left(node: Node) -> None:
    async with aiohttp.ClientSession() as s:
        status, first = await generate(s, node.url, prompt=PROMPT, max_tokens=4)
        assert status == 200, first
        prompt_tokens = first["usage"]["prompt_tokens"]
        status, extended = await generate(s, node.url, prompt=PROMPT + ". One night", max_tokens=4)
        assert status == 200, extended
        # All of the first prompt, at least: the slot kept it (whole tokens, not blocks).
        assert (
            prompt_tokens <= extended["usage"]["cached_tokens"] < extended["usage"]["prompt_tokens"]
        )


async def test_the_context_a_request_may_fill_is_one_slots_cells(node: Node) -> None:
    """1024 cells over 4 slots: 256 each, which the OpenAI surface states in its 400."""
    async with aiohttp.ClientSession() as s:
        async with s.get(node.url + "/v1/models") as resp:
            model = (await resp.json())["data"][0]["id"]
        body = {"model": model, "prompt": PROMPT, "max_tokens": 250}
        async with s.post(node.url + "/v1/completions", json=body) as resp:
            error = await resp.json()
            assert resp.status == 400, error
        assert "256" in error["error"]["message"], error
        status, ok = await generate(s, node.url, prompt=PROMPT, max_tokens=200)
        assert status == 200 and ok["finish_reason"] in ("length", "stop"), ok
