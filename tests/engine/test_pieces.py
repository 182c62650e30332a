"""The cut of a prompt into pieces (engine/scheduling/pieces.py): as few as ``--chunk`` allows,
as even as can be, so that a prompt of two tiles or more never ends in a piece below one."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tinyserve.engine.scheduling.pieces import TILE, next_piece


def cut(left: int, chunk: int) -> list[int]:
    pieces = []
    while left:
        pieces.append(next_piece(left, chunk))
        left -= pieces[-1]
    return pieces


def test_examples() -> None:
    assert cut(132, 128) == [66, 66]  # not 128 and 4
    assert cut(3442, 128) == [128] * 13 + [127] * 14  # not 26 of 128 and one of 114
    assert cut(100, 32) == [25, 25, 25, 25]
    assert cut(129, 128) == [65, 64]
    assert cut(40, 128) == [40]


@given(st.integers(1, 20_000), st.integers(1, 1024))
def test_as_few_pieces_as_the_chunk_allows_and_as_even_as_can_be(left: int, chunk: int) -> None:
    pieces = cut(left, chunk)
    assert sum(pieces) == left
    assert len(pieces) == -(-left // chunk)
    assert max(pieces) <= chunk
    assert max(pieces) - min(pieces) <= 1
    assert pieces == sorted(pieces, reverse=True)


@given(st.integers(2 * TILE, 20_000), st.integers(2 * TILE, 1024))
def test_no_piece_below_a_tile_once_the_chunk_holds_two(left: int, chunk: int) -> None:
    assert min(cut(left, chunk)) >= TILE
