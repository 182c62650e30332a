"""The host tier's store alone: keys that name a whole prefix, a byte bound, LRU order."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tinyserve.engine.host_cache import ROOT, HostBlock, HostCache, block_key, chain_keys

BLOCK = 4


def chain(tokens: list[int], kv_bytes: int = 10) -> list[HostBlock]:
    """The blocks of ``tokens`` (whole blocks), each with ``kv_bytes`` of fake KV."""
    blocks, parent = [], ROOT
    for depth, key in enumerate(chain_keys(tokens, BLOCK)):
        piece = tuple(tokens[depth * BLOCK : (depth + 1) * BLOCK])
        blocks.append(HostBlock(parent, piece, bytes(kv_bytes), depth))
        parent = key
    return blocks


def test_a_key_names_the_whole_prefix() -> None:
    a, b = chain_keys([1, 2, 3, 4, 5, 6, 7, 8], BLOCK), chain_keys([9, 2, 3, 4, 5, 6, 7, 8], BLOCK)
    assert a[1] != b[1]  # the same second block after another first one
    assert a[1] == block_key(a[0], [5, 6, 7, 8])
    assert chain_keys([1, 2, 3], BLOCK) == []


def test_run_follows_the_chain_from_a_parent_and_stops_at_the_first_gap() -> None:
    tokens = list(range(1, 21))  # 5 blocks
    host = HostCache(10**6, BLOCK)
    blocks = chain(tokens)
    for block in blocks[:2] + blocks[3:]:
        host.put(block)
    assert host.run(tokens, 0, ROOT, 5) == blocks[:2]  # block 2 is missing
    assert host.run(tokens, 3, blocks[2].key, 5) == blocks[3:]
    assert host.run(tokens, 3, blocks[2].key, 1) == blocks[3:4]
    assert host.run(tokens, 1, ROOT, 5) == []  # block 1 is only known after block 0
    assert host.run(tokens[:6], 0, ROOT, 5) == blocks[:1]  # a partial block is not looked up


def test_least_recently_used_goes_first() -> None:
    blocks = chain(list(range(1, 13)), kv_bytes=100)  # 3 blocks
    host = HostCache(2 * blocks[0].size, BLOCK)
    host.put(blocks[0])
    host.put(blocks[1])
    assert host.touch(blocks[0].key)
    host.put(blocks[2])
    assert blocks[1].key not in host and blocks[0].key in host and blocks[2].key in host
    assert host.dropped == 1
    assert not host.put(HostBlock(ROOT, (9, 9, 9, 9), bytes(10**4), 0))  # larger than the bound
    assert len(host) == 2


@settings(max_examples=200, deadline=None)
@given(
    capacity=st.integers(0, 5000),
    ops=st.lists(
        st.tuples(
            st.lists(st.integers(0, 3), min_size=BLOCK, max_size=4 * BLOCK), st.integers(0, 900)
        ),
        max_size=40,
    ),
)
def test_the_bound_holds_whatever_is_put(capacity: int, ops: list[tuple[list[int], int]]) -> None:
    host = HostCache(capacity, BLOCK)
    for tokens, kv_bytes in ops:
        for block in chain(tokens, kv_bytes):
            host.put(block)
            assert host.bytes == sum(b.size for b in host.blocks()) <= capacity
