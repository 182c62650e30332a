"""The prefix cache in host memory (``engine/kv/host_cache.py``) on a small arena: what it
stores, what a lookup finds, what a restore writes, what it evicts to make room.

Saved states are fake ones in llama.cpp's layout (``fake_runtime.write_state``: one layer,
each cell's K row its position and token), so a restore shows which token sits at which
position, and a block put back at the wrong place shows."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.engine.fake_runtime import read_state, write_state
from tinyserve.engine.kv.host_cache import NO_HIT, TIER_DISK, TIER_HOST, HostCache
from tinyserve.engine.kv.kv_state import Bytes, StateLayout

BLOCK = 4
LAYOUT = StateLayout.read(write_state(0, 1, {0: 9}), 1)
ROW = BLOCK * LAYOUT.cell_bytes  # bytes of one block


class Slot:
    """A slot whose cells hold positions 0..n-1 of ``tokens``; counts its saves."""

    def __init__(self, tokens: list[int]) -> None:
        self.tokens = tokens
        self.saves = 0

    def save(self) -> Bytes:
        self.saves += 1
        return np.frombuffer(write_state(0, 1, dict(enumerate(self.tokens))), np.uint8)


def cache(blocks: int) -> HostCache:
    return HostCache(LAYOUT, BLOCK, blocks * ROW)


def store(host: HostCache, tokens: list[int]) -> int:
    return host.store(tokens, Slot(tokens).save)


def restored(host: HostCache, prompt: list[int]) -> list[int]:
    """The tokens a restore of ``prompt``'s hit writes into a slot, position by position."""
    written: list[dict[int, int]] = []

    def load(state: Bytes) -> bool:
        written.append(read_state(state.tobytes(), 1))
        return True

    hit = host.lookup(prompt)
    assert host.restore(hit, load)
    [cells] = written
    assert sorted(cells) == list(range(hit.n_tokens))
    return [cells[pos] for pos in range(hit.n_tokens)]


def test_a_stored_prefix_is_found_and_restored_short_of_the_prompts_last_token() -> None:
    host = cache(8)
    tokens = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]  # two blocks and a tail of two
    assert store(host, tokens) == 3
    assert (host.stats.stored_blocks, host.stats.blocks_held) == (3, 3)
    assert host.stats.bytes_held == 3 * ROW
    hit = host.lookup([*tokens, 11])
    assert (hit.n_tokens, hit.partial, hit.disk_tokens) == (10, 2, 0)
    assert restored(host, [*tokens, 11]) == tokens
    assert host.lookup(tokens).n_tokens == 9  # the last token's logits are needed
    assert host.lookup([1, 2, 3, 4, 5, 6, 9, 9]).n_tokens == 6  # a block, then part of one
    assert restored(host, [1, 2, 3, 4, 5, 6, 9, 9]) == [1, 2, 3, 4, 5, 6]
    assert host.lookup([2, 2, 3, 4, 5]) == NO_HIT
    stats = host.stats
    assert (stats.restored_tokens, stats.hit_tokens[TIER_HOST]) == (10 + 6, 10 + 6)
    assert host.peek([*tokens, 11]) == 8  # whole blocks only; counts nothing
    assert stats.restored_tokens == 16


def test_only_what_is_new_is_stored_and_the_slot_saved_only_then() -> None:
    host = cache(8)
    slot = Slot([1, 2, 3, 4, 5, 6, 7, 8])
    assert host.store(slot.tokens, slot.save) == 2
    assert host.store(slot.tokens, slot.save) == 0
    assert host.store(slot.tokens[:6], slot.save) == 0  # a tail inside a block it holds
    assert slot.saves == 1
    longer = Slot([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13])
    assert host.store(longer.tokens, longer.save) == 2  # a block and a tail below the two
    assert host.tree.n_nodes == 4
    assert restored(host, [*longer.tokens, 0]) == longer.tokens


def test_tails_of_one_block_live_side_by_side() -> None:
    host = cache(8)
    assert store(host, [1, 2, 3, 4, 5, 6]) == 2
    assert store(host, [1, 2, 3, 4, 5, 6, 7]) == 1  # a longer tail: one more row
    assert store(host, [1, 2, 3, 4, 5]) == 0  # the start of one it has
    assert store(host, [1, 2, 3, 4, 8]) == 1
    assert restored(host, [1, 2, 3, 4, 5, 6, 7, 0]) == [1, 2, 3, 4, 5, 6, 7]
    assert restored(host, [1, 2, 3, 4, 8, 0]) == [1, 2, 3, 4, 8]
    assert host.tree.n_nodes == 4


def test_the_least_recently_used_leaf_goes_first_and_never_a_parent() -> None:
    host = cache(3)
    a, b = [1, 1, 1, 1, 2, 2, 2, 2], [3, 3, 3, 3]
    assert store(host, a) == 2 and store(host, b) == 1  # full
    assert host.lookup([*a, 0]).n_tokens == 8  # a is the most recently used now
    assert store(host, [4, 4, 4, 4]) == 1  # b goes
    assert store(host, [5, 5, 5, 5]) == 1  # the leaves: a's second block and [4]: a's is older
    # (peek, like lookup, marks what it matches as used: only now)
    assert [host.peek([*t, 0]) for t in (a, b, [4] * 4, [5] * 4)] == [4, 0, 4, 4]
    assert host.stats.evicted_blocks == 2
    assert host.blocks.used == 0 and host.blocks.cached == host.tree.n_nodes == 3


def test_a_store_never_evicts_the_prefix_it_extends() -> None:
    """The blocks a store goes below are pinned while room is made: here the only leaf is
    the new blocks' own parent, so one new block fits and nothing is evicted."""
    host = cache(2)
    assert store(host, [1, 1, 1, 1]) == 1
    prompt = [1, 1, 1, 1, 7, 7, 7, 7, 8, 8, 8, 8]
    assert store(host, prompt) == 1
    assert restored(host, [*prompt, 0]) == prompt[:8]
    assert host.stats.evicted_blocks == 0
    assert host.blocks.used == 0  # the pins were released


def test_a_store_keeps_what_room_can_be_made_for() -> None:
    host = cache(2)
    slot = Slot(list(range(10, 23)))  # three blocks and a tail
    assert host.store(slot.tokens, slot.save) == 2
    assert host.lookup([*slot.tokens, 0]).n_tokens == 8
    assert restored(host, [*slot.tokens, 0]) == slot.tokens[:8]


def test_a_refused_restore_counts_nothing() -> None:
    host = cache(4)
    store(host, [1, 2, 3, 4, 5])
    assert not host.restore(host.lookup([1, 2, 3, 4, 5, 0]), lambda state: False)
    assert host.stats.restored_tokens == 0 and not host.stats.hit_tokens


def test_adopted_blocks_come_from_disk_and_never_evict() -> None:
    host = cache(3)
    kv = Slot([1, 2, 3, 4, 5, 6]).save()
    arena = np.zeros((2, ROW), np.uint8)
    LAYOUT.cut(kv, 0, 6, arena, [0, 1], BLOCK)
    first = host.adopt(-1, [1, 2, 3, 4], arena[0].tobytes(), from_disk=True)
    tail = host.adopt(first, [5, 6], arena[1].tobytes(), from_disk=True)
    assert first >= 0 and tail >= 0
    assert host.adopt(-1, [9, 9, 9, 9], b"short", from_disk=True) == -1  # not a block's size
    hit = host.lookup([1, 2, 3, 4, 5, 6, 0])
    assert (hit.n_tokens, hit.disk_tokens) == (6, 6)
    assert restored(host, [1, 2, 3, 4, 5, 6, 0]) == [1, 2, 3, 4, 5, 6]
    assert host.stats.hit_tokens[TIER_DISK] == 6
    assert host.adopt(-1, [8, 8, 8, 8], arena[0].tobytes(), from_disk=False) >= 0  # full now
    assert host.adopt(-1, [7, 7, 7, 7], arena[0].tobytes(), from_disk=False) == -1
    assert host.peek([1, 2, 3, 4, 0]) == 4 and host.stats.evicted_blocks == 0
    depths = [host.tree.depth(row) for row in host.held()]
    assert depths == sorted(depths) and len(depths) == 3
    assert store(host, [1, 2, 3, 4, 5, 6, 7]) == 1  # stored: from host memory now
    assert host.lookup([1, 2, 3, 4, 5, 6, 7, 0]).disk_tokens == 4


def test_an_arena_smaller_than_a_block_is_refused() -> None:
    with pytest.raises(ValueError, match="hold no block"):
        HostCache(LAYOUT, BLOCK, ROW - 1)


@settings(max_examples=100, deadline=None)
@given(
    rows=st.integers(1, 6),
    ops=st.lists(
        st.tuples(st.booleans(), st.lists(st.integers(1, 3), min_size=1, max_size=14)),
        max_size=30,
    ),
)
def test_whatever_is_stored_a_hit_restores_the_prompts_own_tokens(
    rows: int, ops: list[tuple[bool, list[int]]]
) -> None:
    """Stores and lookups of prompts over a tiny vocabulary (many shared starts and tails)
    in an arena of a few rows: every hit restores exactly the prompt's first tokens, and the
    rows are cached exactly while the tree holds them."""
    host = cache(rows)
    for is_store, tokens in ops:
        if is_store:
            store(host, tokens)
        elif host.lookup(tokens).n_tokens:
            assert restored(host, tokens) == tokens[: host.lookup(tokens).n_tokens]
        blocks = host.blocks
        assert blocks.used == 0 and blocks.cached == host.tree.n_nodes <= rows
        assert host.stats.blocks_held == host.tree.n_nodes
