"""What free slots keep and which one a prompt takes (``engine/resident.py``)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tinyserve.engine.resident import SlotPrefixes, common_start

TOKENS = st.lists(st.integers(0, 3), max_size=12)


@given(TOKENS, TOKENS)
def test_common_start_is_the_shared_first_tokens(a: list[int], b: list[int]) -> None:
    shared = [x == y for x, y in zip(a, b, strict=False)]
    assert common_start(a, b) == (shared.index(False) if False in shared else len(shared))


def test_the_lowest_free_slot_unless_one_keeps_enough_of_the_prompt() -> None:
    slots = SlotPrefixes(4, min_reuse=3)
    slots.keep(0, [1, 2])
    slots.keep(2, [1, 2, 3, 4, 5])
    slots.keep(3, [1, 2, 3, 9])
    assert slots.choose([1, 2, 3, 4, 5, 6], [0, 1, 2, 3]) == (2, 5)
    assert slots.choose([1, 2, 3, 4, 5], [0, 1, 2, 3]) == (2, 4)  # never the last token
    assert slots.choose([1, 2, 3, 4, 5], [0, 1, 3]) == (3, 3)  # the longest of the free
    assert slots.choose([1, 2, 7, 8], [1, 0, 2, 3]) == (1, 0)  # 2 < min_reuse: lowest free
    assert slots.choose([1, 2, 7, 8], [0, 1]) == (0, 2)  # what the lowest keeps still counts
    slots.take(2, 5)
    assert slots.tokens[2] == []  # granted: its cells are the request's now
    assert slots.choose([1, 2, 3, 4, 5, 6], [2, 3]) == (3, 3)


def test_equals_go_to_the_lowest_slot() -> None:
    slots = SlotPrefixes(4, min_reuse=2)
    for slot in (1, 2, 3):
        slots.keep(slot, [5, 6, 7, slot])
    assert slots.choose([5, 6, 7, 0, 0], [1, 2, 3]) == (1, 3)
    assert slots.choose([5, 6, 7, 3, 0], [1, 2, 3]) == (3, 4)


@given(
    kept=st.lists(TOKENS, min_size=4, max_size=4),
    free=st.sets(st.integers(0, 3), min_size=1).map(sorted),
    prompt=TOKENS.filter(bool),
    min_reuse=st.integers(0, 4),
)
def test_choose_takes_the_longest_common_start_or_else_the_lowest_free_slot(
    kept: list[list[int]], free: list[int], prompt: list[int], min_reuse: int
) -> None:
    slots = SlotPrefixes(4, min_reuse)
    for slot, tokens in enumerate(kept):
        slots.keep(slot, tokens)
    slot, reused = slots.choose(prompt, free)
    shared = {s: common_start(prompt[:-1], kept[s]) for s in free}
    best = max(shared.values())
    if best >= min_reuse:
        assert slot == min(s for s in free if shared[s] == best) and reused == best
    else:
        assert (slot, reused) == (free[0], shared[free[0]])
    assert reused < len(prompt) and prompt[:reused] == kept[slot][:reused]
    assert slots.tokens == kept  # choosing changes nothing
