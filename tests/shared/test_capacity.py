"""tinyserve/capacity.py: the one capacity rule both the engine and the frontends decide by."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tinyserve.capacity import blocks_needed, fits_context, queue_full, queued


def test_blocks_needed_rounds_up() -> None:
    assert blocks_needed(1, 16) == 1
    assert blocks_needed(16, 16) == 1
    assert blocks_needed(17, 16) == 2
    assert blocks_needed(0, 16) == 0


@given(st.integers(0, 10_000), st.integers(1, 512))
def test_blocks_needed_is_the_ceiling(tokens: int, block_size: int) -> None:
    need = blocks_needed(tokens, block_size)
    assert (need - 1) * block_size < tokens <= need * block_size or tokens == need == 0


def test_fits_context_needs_a_prompt_and_the_whole_request_in_one_slot() -> None:
    assert fits_context(10, 6, n_ctx=16)
    assert not fits_context(0, 6, n_ctx=16)  # no prompt
    assert not fits_context(10, 7, n_ctx=16)  # past one slot's cells


def test_requests_bound_for_free_slots_are_not_queued() -> None:
    assert queued(waiting=3, free_slots=4) == 0
    assert queued(waiting=5, free_slots=4) == 1
    assert not queue_full(waiting=5, free_slots=4, max_queue=2)
    assert queue_full(waiting=6, free_slots=4, max_queue=2)
    assert queue_full(waiting=2, free_slots=0, max_queue=2)
