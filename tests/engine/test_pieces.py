"""The cut of a prompt into pieces (engine/scheduling/pieces.py): pieces of ``--chunk``, and
never a last one of a few rows to a tile where the chunk leaves room to avoid it."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tinyserve.engine.scheduling.pieces import SMALL, TILE, next_piece


def cut(left: int, chunk: int) -> list[int]:
    pieces = []
    while left:
        pieces.append(next_piece(left, chunk))
        left -= pieces[-1]
    return pieces


def test_examples() -> None:
    assert cut(160, 128) == [95, 65]  # three tiles, not 128 and then 32 rows one at a time
    assert cut(330, 128) == [128, 128, 74]
    assert cut(132, 128) == [128, 4]  # 4 rows alone cost less than one more tile
    assert cut(3442, 128) == [128] * 26 + [114]
    assert cut(100, 32) == [32, 32, 32, 4]  # a chunk below a tile: no piece fills one
    assert cut(40, 128) == [40]


@given(st.integers(1, 20_000), st.integers(1, 1024))
def test_pieces_of_the_chunk_but_the_last_two(left: int, chunk: int) -> None:
    pieces = cut(left, chunk)
    assert sum(pieces) == left
    assert max(pieces) <= chunk
    assert pieces[:-2] == [chunk] * (len(pieces) - 2)
    assert len(pieces) == -(-left // chunk)


@given(st.integers(1, 20_000), st.integers(2 * TILE, 1024))
def test_no_piece_below_a_tile_but_a_whole_prompt_or_a_last_few_rows(left: int, chunk: int) -> None:
    pieces = cut(left, chunk)
    if len(pieces) > 1:
        assert all(piece > TILE for piece in pieces[:-1])
        assert pieces[-1] > TILE or pieces[-1] < SMALL
