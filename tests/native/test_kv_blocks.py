"""BlockAccountant: worked examples, then a stateful comparison with RefAccountant."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from tinyserve_native.kv_blocks import BlockAccountant

from .reference import RefAccountant

TOTAL = 8


def _counts(acc: BlockAccountant) -> tuple[int, int, int]:
    return acc.free, acc.used, acc.cached


def test_fresh_accountant_is_all_free() -> None:
    acc = BlockAccountant(4, 16)
    assert (acc.total, acc.block_size) == (4, 16)
    assert _counts(acc) == (4, 0, 0)
    assert acc.available == 4
    assert acc.allocate(3) == [0, 1, 2]


@pytest.mark.parametrize(("n_tokens", "blocks"), [(0, 0), (1, 1), (16, 1), (17, 2), (32, 2)])
def test_blocks_for_rounds_up(n_tokens: int, blocks: int) -> None:
    assert BlockAccountant(4, 16).blocks_for(n_tokens) == blocks


def test_shared_block_counts_once() -> None:
    acc = BlockAccountant(4, 16)
    [b] = acc.allocate(1)
    acc.acquire(b)
    assert acc.refcount(b) == 2
    assert _counts(acc) == (3, 1, 0)
    acc.release(b)
    assert _counts(acc) == (3, 1, 0)
    acc.release(b)
    assert _counts(acc) == (4, 0, 0)


def test_cached_blocks_are_evictable_until_acquired_again() -> None:
    acc = BlockAccountant(4, 16)
    ids = acc.allocate(3)
    for b in ids:
        acc.set_cached(b, True)
    acc.release_all([ids[2], ids[0], ids[1]])
    assert _counts(acc) == (1, 0, 3)
    assert acc.available == 4
    acc.acquire(ids[0])
    assert _counts(acc) == (1, 1, 2)
    with pytest.raises(ValueError):
        acc.evict(ids[0])  # pinned by the hit
    acc.release(ids[0])
    acc.evict(ids[0])
    assert _counts(acc) == (2, 0, 2)


def test_evict_and_uncache_free_a_cached_block() -> None:
    acc = BlockAccountant(2, 16)
    a, b = acc.allocate(2)
    acc.set_cached(a, True)
    acc.set_cached(b, True)
    acc.release_all([a, b])
    acc.evict(a)
    acc.set_cached(b, False)
    assert _counts(acc) == (2, 0, 0)
    assert not acc.is_cached(a)


def test_allocate_beyond_free_raises_and_changes_nothing() -> None:
    acc = BlockAccountant(3, 16)
    acc.allocate(2)
    assert not acc.can_allocate(2)
    with pytest.raises(ValueError):
        acc.allocate(2)
    assert _counts(acc) == (1, 2, 0)


@pytest.mark.parametrize(
    "op",
    [
        lambda acc: acc.release(0),  # refcount 0
        lambda acc: acc.acquire(0),  # free: allocate instead
        lambda acc: acc.evict(0),  # not cached
        lambda acc: acc.set_cached(0, True),  # free blocks hold nothing to cache
        lambda acc: acc.allocate(-1),
        lambda acc: acc.blocks_for(-1),
    ],
)
def test_invalid_operations_raise_value_error(op: Callable[[BlockAccountant], Any]) -> None:
    acc = BlockAccountant(2, 16)
    with pytest.raises(ValueError):
        op(acc)
    assert _counts(acc) == (2, 0, 0)


def test_evicting_a_pinned_cached_block_is_refused() -> None:
    acc = BlockAccountant(2, 16)
    [b] = acc.allocate(1)
    acc.set_cached(b, True)
    with pytest.raises(ValueError):
        acc.evict(b)


@pytest.mark.parametrize("block_id", [-1, 2, 2**40])
def test_out_of_range_ids_raise_index_error(block_id: int) -> None:
    with pytest.raises(IndexError):
        BlockAccountant(2, 16).refcount(block_id)


@pytest.mark.parametrize(("total", "size"), [(0, 16), (4, 0), (-1, 16)])
def test_constructor_rejects_non_positive_sizes(total: int, size: int) -> None:
    with pytest.raises(ValueError):
        BlockAccountant(total, size)


class AccountantMachine(RuleBasedStateMachine):
    """Random operation sequences on both models; results and errors must agree."""

    def __init__(self) -> None:
        super().__init__()
        self.acc = BlockAccountant(TOTAL, 4)
        self.ref = RefAccountant(TOTAL, 4)

    def _both(self, name: str, *args: Any) -> None:
        expected: type[Exception] | None = None
        try:
            getattr(self.ref, name)(*args)
        except (ValueError, IndexError) as exc:
            expected = type(exc)
        if expected is None:
            getattr(self.acc, name)(*args)
        else:
            with pytest.raises(expected):
                getattr(self.acc, name)(*args)

    @rule(n=st.integers(0, TOTAL + 1), cache=st.booleans())
    def allocate(self, n: int, cache: bool) -> None:
        if n > self.ref.free:
            with pytest.raises(ValueError):
                self.acc.allocate(n)
            return
        ids = self.acc.allocate(n)
        self.ref.claim(ids)
        if cache:  # as after a prefill whose blocks go into the prefix cache
            for b in ids:
                self._both("set_cached", b, True)

    def _pick(self, data: st.DataObject, ids: list[int]) -> int | None:
        return data.draw(st.sampled_from(ids)) if ids else None

    @rule(data=st.data())
    def acquire_cached(self, data: st.DataObject) -> None:
        # An evictable block (a prefix hit) or one already in use (a shared prefix).
        held = [b for b, rc in enumerate(self.ref.refcounts) if rc > 0]
        block = self._pick(data, self.ref.evictable + held)
        if block is not None:
            self._both("acquire", block)

    @rule(data=st.data(), cached=st.booleans())
    def set_cached_held(self, data: st.DataObject, cached: bool) -> None:
        held = [b for b, rc in enumerate(self.ref.refcounts) if rc > 0]
        block = self._pick(data, held + self.ref.evictable)
        if block is not None:
            self._both("set_cached", block, cached)

    @rule(data=st.data())
    def release_held(self, data: st.DataObject) -> None:
        held = [b for b, rc in enumerate(self.ref.refcounts) if rc > 0]
        ids = data.draw(st.lists(st.sampled_from(held), min_size=1, unique=True)) if held else []
        for b in ids:
            self.ref.release(b)
        self.acc.release_all(ids)

    @rule(data=st.data())
    def evict_cached(self, data: st.DataObject) -> None:
        block = self._pick(data, self.ref.evictable)
        if block is not None:
            self._both("evict", block)

    @rule(
        op=st.sampled_from(["acquire", "release", "evict", "set_cached"]),
        block=st.integers(-1, TOTAL),
        flag=st.booleans(),
    )
    def any_op_on_any_id(self, op: str, block: int, flag: bool) -> None:
        # Mostly error paths: both models must refuse the same way.
        self._both(op, *((block, flag) if op == "set_cached" else (block,)))

    @invariant()
    def states_agree(self) -> None:
        acc, ref = self.acc, self.ref
        assert acc.free + acc.used + acc.cached == TOTAL
        assert _counts(acc) == (ref.free, ref.used, ref.cached)
        assert acc.available == ref.free + ref.cached
        assert [acc.refcount(b) for b in range(TOTAL)] == ref.refcounts
        assert [acc.is_cached(b) for b in range(TOTAL)] == ref.cached_flags


AccountantMachine.TestCase.settings = settings(
    max_examples=100, stateful_step_count=40, deadline=None
)
test_accountant_matches_reference = AccountantMachine.TestCase
