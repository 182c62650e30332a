"""BatchBuilder: rows read back through ctypes, against RefBatch and a real llama_batch."""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tinyserve_native.batch_builder import BATCH_FIELD_OFFSETS, BATCH_STRUCT_SIZE, BatchBuilder

from .reference import RefBatch, Row

CAPACITY = 8
I32 = ctypes.c_int32


class CBatch(ctypes.Structure):
    """Our own ctypes mirror of llama.h's ``llama_batch``, so most tests need no llama_cpp."""

    _fields_ = [
        ("n_tokens", I32),
        ("token", ctypes.POINTER(I32)),
        ("embd", ctypes.POINTER(ctypes.c_float)),
        ("pos", ctypes.POINTER(I32)),
        ("n_seq_id", ctypes.POINTER(I32)),
        ("seq_id", ctypes.POINTER(ctypes.POINTER(I32))),
        ("logits", ctypes.POINTER(ctypes.c_int8)),
    ]


class OwnedBatch:
    """A ``CBatch`` with arrays this object keeps alive (as ``llama_batch_init`` would)."""

    def __init__(self, capacity: int) -> None:
        self.arrays: list[Any] = [
            (I32 * capacity)(),
            (I32 * capacity)(),
            (I32 * capacity)(),
            (ctypes.c_int8 * capacity)(),
        ]
        self.seq_cells = [(I32 * 1)() for _ in range(capacity)]
        seq_ptrs = (ctypes.POINTER(I32) * capacity)(
            *(ctypes.cast(c, ctypes.POINTER(I32)) for c in self.seq_cells)
        )
        self.arrays.append(seq_ptrs)
        token, pos, n_seq_id, logits = self.arrays[:4]
        self.struct = CBatch(0, token, None, pos, n_seq_id, seq_ptrs, logits)


def read_rows(batch: Any) -> list[Row]:
    """The batch's rows ``[0, n_tokens)``, checking each carries exactly one sequence id."""
    rows = []
    for i in range(batch.n_tokens):
        assert batch.n_seq_id[i] == 1
        rows.append((batch.token[i], batch.pos[i], batch.seq_id[i][0], bool(batch.logits[i])))
    return rows


@pytest.fixture
def owned() -> OwnedBatch:
    return OwnedBatch(CAPACITY)


def builder_for(owned: OwnedBatch) -> BatchBuilder:
    return BatchBuilder(ctypes.addressof(owned.struct), CAPACITY)


def test_add_writes_a_row_and_counts_it(owned: OwnedBatch) -> None:
    builder = builder_for(owned)
    assert builder.add(42, 7, 3, True) == 0
    assert builder.add(43, 8, 3, False) == 1
    assert (builder.n_tokens, builder.capacity, builder.free) == (2, CAPACITY, CAPACITY - 2)
    assert read_rows(owned.struct) == [(42, 7, 3, True), (43, 8, 3, False)]
    builder.clear()
    assert owned.struct.n_tokens == 0


def test_add_span_asks_logits_only_for_its_last_row(owned: OwnedBatch) -> None:
    builder = builder_for(owned)
    builder.add(1, 0, 0, True)
    assert builder.add_span([9, 10, 11, 12], 1, 3, 20, 5, True) == 3
    assert read_rows(owned.struct)[1:] == [
        (10, 20, 5, False),
        (11, 21, 5, False),
        (12, 22, 5, True),
    ]


def test_add_span_with_logits_all_asks_for_every_row(owned: OwnedBatch) -> None:
    builder = builder_for(owned)
    assert builder.add_span([9, 10, 11], 0, 3, 0, 2, False, True) == 2
    assert [row[3] for row in read_rows(owned.struct)] == [True, True, True]


def test_a_span_that_does_not_fit_writes_nothing(owned: OwnedBatch) -> None:
    builder = builder_for(owned)
    builder.add_span(list(range(CAPACITY - 1)), 0, CAPACITY - 1, 0, 0, False)
    with pytest.raises(IndexError):
        builder.add_span([5, 6], 0, 2, 100, 1, True)
    assert builder.n_tokens == CAPACITY - 1
    builder.add(5, 100, 1, True)
    with pytest.raises(IndexError):
        builder.add(6, 101, 1, True)


def test_a_bad_token_mid_span_leaves_the_batch_unchanged(owned: OwnedBatch) -> None:
    builder = builder_for(owned)
    with pytest.raises(OverflowError):
        builder.add_span([1, 2, 2**40], 0, 3, 0, 0, True)
    assert builder.n_tokens == 0


@pytest.mark.parametrize(
    ("start", "count", "pos0", "seq_id"),
    [(0, 0, 0, 0), (-1, 2, 0, 0), (2, 2, 0, 0), (0, 2, -1, 0), (0, 2, 0, -1), (0, 2, 2**31 - 1, 0)],
)
def test_add_span_rejects_bad_arguments(
    owned: OwnedBatch, start: int, count: int, pos0: int, seq_id: int
) -> None:
    with pytest.raises(ValueError):
        builder_for(owned).add_span([1, 2, 3], start, count, pos0, seq_id, True)
    assert owned.struct.n_tokens == 0


def test_constructor_rejects_null_and_embedding_batches() -> None:
    with pytest.raises(ValueError):
        BatchBuilder(0, 4)
    embd_only = CBatch()
    with pytest.raises(ValueError):
        BatchBuilder(ctypes.addressof(embd_only), 4)


# Small ranges on purpose: they make full batches and negative arguments common.
TOKENS = st.integers(0, 50_000)
POS = st.integers(-1, 40)
SEQ = st.integers(-1, 3)
OPS = st.one_of(
    st.tuples(st.just("clear")),
    st.tuples(st.just("add"), TOKENS, POS, SEQ, st.booleans()),
    st.tuples(
        st.just("add_span"),
        st.lists(TOKENS, max_size=4),
        st.integers(-1, 4),
        st.integers(0, 4),
        POS,
        SEQ,
        st.booleans(),
        st.booleans(),
    ),
)


def _apply(target: Any, op: tuple[Any, ...]) -> tuple[str, Any]:
    try:
        return "ok", getattr(target, op[0])(*op[1:])
    except (IndexError, ValueError) as exc:
        return type(exc).__name__, None


@settings(max_examples=200, deadline=None)
@given(ops=st.lists(OPS, max_size=25))
def test_rows_match_reference(ops: list[tuple[Any, ...]]) -> None:
    capacity = 4  # small, so that sequences often fill the batch
    owned = OwnedBatch(capacity)
    builder = BatchBuilder(ctypes.addressof(owned.struct), capacity)
    ref = RefBatch(capacity)
    for op in ops:
        assert _apply(builder, op) == _apply(ref, op), op
        assert read_rows(owned.struct) == ref.rows
        assert builder.free == capacity - len(ref.rows)


@pytest.fixture
def llama_batch() -> Iterator[Any]:
    llama_cpp = pytest.importorskip("llama_cpp")
    batch = llama_cpp.llama_batch_init(CAPACITY, 0, 1)
    yield batch
    llama_cpp.llama_batch_free(batch)


def test_declared_layout_matches_llama_cpp(llama_batch: Any) -> None:
    struct = type(llama_batch)
    assert ctypes.sizeof(struct) == BATCH_STRUCT_SIZE == ctypes.sizeof(CBatch)
    assert {name: getattr(struct, name).offset for name in BATCH_FIELD_OFFSETS} == (
        BATCH_FIELD_OFFSETS
    )


def test_rows_land_in_a_real_llama_batch(llama_batch: Any) -> None:
    builder = BatchBuilder(ctypes.addressof(llama_batch), CAPACITY)
    builder.add(11, 30, 2, True)
    builder.add_span([100, 101, 102, 103], 0, 4, 0, 1, True)
    assert llama_batch.n_tokens == 5
    assert read_rows(llama_batch) == [
        (11, 30, 2, True),
        (100, 0, 1, False),
        (101, 1, 1, False),
        (102, 2, 1, False),
        (103, 3, 1, True),
    ]
    builder.clear()
    builder.add(7, 31, 2, True)
    assert read_rows(llama_batch) == [(7, 31, 2, True)]
