"""llama.cpp's saved sequence state cut into blocks and joined back (``engine/kv/kv_state.py``):
with the real model, and as a property over synthetic states of any layout it can take."""

from __future__ import annotations

import struct
from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tinyserve.engine.kv.kv_state import Bytes, StateFormatError, StateLayout
from tinyserve.engine.runtime.runtime import LlamaRuntime

MAGIC = 0xAF143CD8
PROMPT = list(range(100, 137))  # 37 tokens: two blocks of 16 and a tail of 5
BLOCK = 16


@pytest.fixture
def clean(runtime: LlamaRuntime) -> Iterator[LlamaRuntime]:
    """The shared runtime with every slot's cells dropped before and after."""
    runtime.clear()
    yield runtime
    runtime.clear()


def decode(runtime: LlamaRuntime, tokens: list[int], pos: int, slot: int) -> int:
    """Decode ``tokens`` into ``slot`` from ``pos``; returns the last row (it has logits)."""
    runtime.batch.clear()
    last = runtime.batch.add_span(tokens, 0, len(tokens), pos, slot, True)
    assert runtime.decode() == 0
    return last


def cut_all(layout: StateLayout, state: Bytes, block_size: int = BLOCK) -> Bytes:
    """``state``'s cells cut into rows 0.. of a fresh arena, in position order."""
    count, _ = layout.positions(state)
    rows = -(-count // block_size)
    arena = np.zeros((rows, block_size * layout.cell_bytes), np.uint8)
    layout.cut(state, 0, count, arena, list(range(rows)), block_size)
    return arena


def join_all(layout: StateLayout, arena: Bytes, n_cells: int, block_size: int = BLOCK) -> Bytes:
    out = np.full(layout.state_bytes(n_cells) + 64, 0xEE, np.uint8)  # longer, not clean
    rows = list(range(-(-n_cells // block_size)))
    return layout.join(arena, rows, block_size, n_cells, out).copy()


def test_a_saved_state_cut_into_blocks_and_joined_is_the_same_bytes(clean: LlamaRuntime) -> None:
    runtime = clean
    decode(runtime, PROMPT, 0, 0)
    state = runtime.save_seq(0).copy()
    layout = StateLayout.read(state.tobytes(), runtime.n_layer)
    assert layout.n_stream == 4 and layout.cell_record == 12  # no extension for this model
    assert layout.state_bytes(len(PROMPT)) == len(state)
    arena = cut_all(layout, state)
    assert np.array_equal(join_all(layout, arena, len(PROMPT)), state)
    # Cut from a later block on, into other rows: the same bytes a row as cut whole.
    middle = np.zeros((2, BLOCK * layout.cell_bytes), np.uint8)
    layout.cut(state, BLOCK, len(PROMPT) - BLOCK, middle, [1, 0], BLOCK)
    assert np.array_equal(middle[1], arena[1]) and np.array_equal(middle[0], arena[2])
    # Blocks from anywhere in an arena join into one state: the first from its own row.
    mixed = np.stack([arena[0], middle[1], middle[0]])
    assert np.array_equal(join_all(layout, mixed, len(PROMPT)), state)


def permuted(layout: StateLayout, state: Bytes, slot: int, order: list[int]) -> Bytes:
    """``state`` (saved from ``slot``) with its cells stored in ``order``: every cell record
    and every K and V row moved alike, as llama.cpp would write cells placed that way."""
    count, _ = layout.positions(state)
    out, at = state.copy(), 12 + 4 * (slot + 1)
    shapes = [(0, 1, layout.cell_record)] + [
        (len(r.header), r.runs, r.width) for r in layout.records
    ]
    for i, (header, runs, width) in enumerate(shapes):
        at += header + (len(layout.middle) if i == 1 else 0)
        size = runs * count * width
        payload = state[at : at + size].reshape(runs, count, width)
        out[at : at + size] = payload[:, order, :].reshape(-1)
        at += size
    return out


def test_cells_out_of_position_order_are_joined_in_order_and_predict_the_same(
    clean: LlamaRuntime,
) -> None:
    """Cells that llama.cpp holds out of position order (a saved state loaded so, then saved
    again by llama.cpp itself): cut, joined and loaded into another slot, they give the next
    token the logits the original slot gives.

    Dropping a sequence's tail and decoding it again does not reorder cells in this llama.cpp
    (its search for free cells goes back to the first one freed), so the order is made by
    loading. Held out of order, the cells themselves predict differently (up to 0.45 in a
    logit, measured: the CPU attention kernel accumulates in f16, in cell order), which is
    what a join that kept the cell order would show."""
    runtime, n = clean, len(PROMPT)
    decode(runtime, PROMPT, 0, 0)
    state = runtime.save_seq(0).copy()
    layout = StateLayout.read(state.tobytes(), runtime.n_layer)
    order = list(np.random.default_rng(7).permutation(n))
    assert runtime.load_seq(1, permuted(layout, state, 0, order))
    shuffled = runtime.save_seq(1).copy()
    assert list(layout.positions(shuffled)[1]) == order  # out of order, as llama.cpp wrote it
    joined = join_all(layout, cut_all(layout, shuffled), n)
    assert list(layout.positions(joined)[1]) == list(range(n))
    assert runtime.load_seq(2, joined)
    runtime.batch.clear()
    rows = [runtime.batch.add(555, n, slot, True) for slot in (0, 2)]
    assert runtime.decode() == 0
    original, restored = (runtime.logits(row).copy() for row in rows)
    assert float(np.abs(restored - original).max()) < 1e-3


# -- synthetic states --------------------------------------------------------------------------


def synthetic(
    k_widths: list[int],
    v_widths: list[int],
    v_trans: bool,
    cells: list[tuple[int, bytes]],
    seed: int,
    n_stream: int = 2,
) -> tuple[bytes, bytes]:
    """A state in llama.cpp's layout for stream 0 of ``n_stream``: ``cells`` as (position,
    extension of the cell record) in storage order, K rows of ``k_widths`` bytes per layer,
    V rows of ``v_widths`` (transposed: that many one-byte elements, one run each); the
    payload random. Returns it and the same state with its cells in position order."""
    rng = np.random.default_rng(seed)
    order = sorted(range(len(cells)), key=lambda i: cells[i][0])

    def write(index: list[int]) -> bytes:
        out = [struct.pack("<IiII", MAGIC, 0, n_stream, len(cells))]
        for i in index:
            pos, extension = cells[i]
            out.append(struct.pack("<iI", pos, 1) + extension + struct.pack("<i", 0))
        out.append(struct.pack("<II", int(v_trans), len(k_widths)))
        for width, rows in zip(k_widths, k_rows, strict=True):
            out.append(struct.pack("<iQ", 1, width) + rows[index].tobytes())
        for width, rows in zip(v_widths, v_rows, strict=True):
            if v_trans:  # n_embd runs of one element per cell
                out.append(struct.pack("<iII", 1, 1, width) + rows[:, index].tobytes())
            else:
                out.append(struct.pack("<iQ", 1, width) + rows[index].tobytes())
        out.append(b"\0" * 4 * (n_stream - 1))
        return b"".join(out)

    k_rows = [rng.integers(0, 256, (len(cells), w), np.uint8) for w in k_widths]
    shape = (lambda w: (w, len(cells))) if v_trans else (lambda w: (len(cells), w))
    v_rows = [rng.integers(0, 256, shape(w), np.uint8) for w in v_widths]
    return write(list(range(len(cells)))), write(order)


@settings(max_examples=200, deadline=None)
@given(
    cell_record=st.sampled_from([12, 16]),
    n_layer=st.integers(1, 3),
    v_trans=st.booleans(),
    positions=st.integers(1, 40).flatmap(lambda n: st.permutations(range(n))),
    data=st.data(),
    block_size=st.integers(1, 9),
)
def test_join_of_cut_is_the_state_with_its_cells_in_position_order(
    cell_record: int,
    n_layer: int,
    v_trans: bool,
    positions: list[int],
    data: st.DataObject,
    block_size: int,
) -> None:
    widths = st.lists(st.integers(1, 24), min_size=n_layer, max_size=n_layer)
    k_widths, v_widths = data.draw(widths), data.draw(widths)[: data.draw(st.integers(1, n_layer))]
    extension = st.binary(min_size=cell_record - 12, max_size=cell_record - 12)
    cells = [(pos, data.draw(extension)) for pos in positions]
    state, in_order = synthetic(k_widths, v_widths, v_trans, cells, data.draw(st.integers(0, 99)))
    layout = StateLayout.read(state, n_layer)
    assert layout.cell_record == cell_record
    arena = cut_all(layout, np.frombuffer(state, np.uint8), block_size)
    assert join_all(layout, arena, len(cells), block_size).tobytes() == in_order


def test_extended_cell_records_are_told_apart_from_the_layer_count() -> None:
    """One cell of 16-byte records, one layer, V transposed: read as 12-byte records, the
    cell's seq_id (0) and the real v_trans (1) look like v_trans 0 and one layer."""
    state, _ = synthetic([8], [8], True, [(0, b"\0" * 4)], 0)
    assert StateLayout.read(state, 1).cell_record == 16


def test_a_cut_block_is_a_row_of_the_arena_and_leaves_the_rest_of_the_row() -> None:
    cells = [(p, b"") for p in (2, 0, 1)]
    state, _ = synthetic([4], [4], False, cells, seed=1)
    layout = StateLayout.read(state, 1)
    arena = np.full((3, 4 * layout.cell_bytes), 7, np.uint8)
    layout.cut(np.frombuffer(state, np.uint8), 1, 2, arena, [2], 4)  # positions 1 and 2
    assert (arena[:2] == 7).all()  # other rows untouched
    positions = arena[2, : 2 * 12].view(np.int32).reshape(2, 3)[:, 0]
    assert list(positions) == [1, 2]


# -- what it refuses ---------------------------------------------------------------------------


def plain(n_cells: int = 3, n_stream: int = 2) -> bytes:
    return synthetic([8], [8], False, [(p, b"") for p in range(n_cells)], 0, n_stream)[0]


NOT_PLAIN = "do not add up|no cell record size fits"  # the records' sizes are wrong


@pytest.mark.parametrize(
    ("state", "n_layer", "why"),
    [
        (b"\0" * 8, 1, "a state of 8 bytes"),
        (struct.pack("<IiI", 0x12345678, 0, 1) + plain()[12:], 1, "not a sequence state"),
        (struct.pack("<IiIII", MAGIC, 0, 2, 0, 0), 1, "holds no cells"),
        (plain(), 2, "no cell record size fits"),  # two layers expected, one there
        (plain()[:-5], 1, NOT_PLAIN),  # truncated
        (plain() + b"\0" * 4, 1, NOT_PLAIN),  # a stream more than the header says
    ],
)
def test_states_it_cannot_take_apart_are_refused(state: bytes, n_layer: int, why: str) -> None:
    with pytest.raises(StateFormatError, match=why):
        StateLayout.read(state, n_layer)


def test_cut_refuses_cells_that_are_not_one_sequence_from_position_0() -> None:
    layout = StateLayout.read(plain(), 1)
    gap, _ = synthetic([8], [8], False, [(0, b""), (1, b""), (3, b"")], 0)
    arena = np.zeros((1, 4 * layout.cell_bytes), np.uint8)
    with pytest.raises(StateFormatError, match=r"not positions 0\.\.n-1"):
        layout.cut(np.frombuffer(gap, np.uint8), 0, 3, arena, [0], 4)
    with pytest.raises(ValueError, match="into 2 rows"):  # 3 cells fill one row of 4
        layout.cut(np.frombuffer(plain(), np.uint8), 0, 3, arena, [0, 1], 4)
    with pytest.raises(ValueError, match=r"cells 2\.\.5 of 3"):
        layout.cut(np.frombuffer(plain(), np.uint8), 2, 3, arena, [0], 4)
