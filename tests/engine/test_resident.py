"""What free slots keep and which one a prompt takes (``engine/kv/resident.py``)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tinyserve.engine.kv.resident import SlotPrefixes, common_start, runs

TOKENS = st.lists(st.integers(0, 3), max_size=12)


@given(TOKENS, TOKENS)
def test_common_start_is_the_shared_first_tokens(a: list[int], b: list[int]) -> None:
    shared = [x == y for x, y in zip(a, b, strict=False)]
    assert common_start(a, b) == (shared.index(False) if False in shared else len(shared))


def test_the_longest_common_start_else_the_slot_that_matters_least() -> None:
    slots = SlotPrefixes(4, min_reuse=3)
    slots.keep(2, [1, 2, 3, 4, 5])
    slots.keep(3, [1, 2, 3, 9])
    slots.keep(0, [1, 2])  # kept last
    assert slots.choose([1, 2, 3, 4, 5, 6], [0, 1, 2, 3]) == (2, 5)
    assert slots.choose([1, 2, 3, 4, 5], [0, 1, 2, 3]) == (2, 4)  # never the last token
    assert slots.choose([1, 2, 3, 4, 5], [0, 1, 3]) == (3, 3)  # the longest of those offered
    assert slots.choose([1, 2, 7, 8], [0, 1, 2, 3]) == (1, 0)  # 2 < min_reuse: one keeping none
    assert slots.choose([1, 2, 7, 8], [0, 2, 3]) == (2, 2)  # else the one kept longest ago
    assert slots.choose([1, 2, 7, 8], [0]) == (0, 2)  # what it keeps still counts
    slots.take(2)
    assert slots.tokens[2] == []  # granted: its cells are the request's now
    assert slots.choose([1, 2, 3, 4, 5, 6], [2, 3]) == (3, 3)


def test_equals_go_to_the_lowest_slot() -> None:
    slots = SlotPrefixes(4, min_reuse=2)
    for slot in (1, 2, 3):
        slots.keep(slot, [5, 6, 7, slot])
    assert slots.choose([5, 6, 7, 0, 0], [1, 2, 3]) == (1, 3)
    assert slots.choose([5, 6, 7, 3, 0], [1, 2, 3]) == (3, 4)


def test_only_slots_that_keep_running_ids_together_are_offered() -> None:
    slots = SlotPrefixes(5, min_reuse=2)
    assert slots.offered([0, 1, 2, 3, 4]) == [0, 1, 2, 3, 4]  # none running: any
    assert slots.offered([0, 3, 4]) == [0, 3]  # 1 and 2 run: next to them
    assert slots.offered([0, 2, 4]) == [2]  # 1 and 3 run: 2 joins them into one run
    assert runs({1, 3}) == 2 and runs({1, 2, 3}) == 1 and runs(set()) == 0


@given(
    kept=st.lists(TOKENS, min_size=4, max_size=4),
    order=st.permutations(range(4)),
    offered=st.sets(st.integers(0, 3), min_size=1).map(sorted),
    prompt=TOKENS.filter(bool),
    min_reuse=st.integers(0, 4),
)
def test_choose_takes_the_longest_common_start_or_else_the_spare_slot(
    kept: list[list[int]],
    order: list[int],
    offered: list[int],
    prompt: list[int],
    min_reuse: int,
) -> None:
    slots = SlotPrefixes(4, min_reuse)
    for slot in order:  # kept in this order: the first is the one kept longest ago
        slots.keep(slot, kept[slot])
    slot, reused = slots.choose(prompt, offered)
    shared = {s: common_start(prompt[:-1], kept[s]) for s in offered}
    best = max(shared.values())
    if best >= min_reuse:
        assert slot == min(s for s in offered if shared[s] == best) and reused == best
    else:
        empty = [s for s in offered if not kept[s]]
        spare = empty[0] if empty else min(offered, key=order.index)
        assert (slot, reused) == (spare, shared[spare])
    assert reused < len(prompt) and prompt[:reused] == kept[slot][:reused]
    assert slots.tokens == kept  # choosing changes nothing
