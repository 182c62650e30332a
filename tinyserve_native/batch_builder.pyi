"""Writes token rows straight into the arrays of a llama.cpp ``llama_batch``.

Typical use, once per engine tick::

    batch = llama_cpp.llama_batch_init(capacity, 0, 1)
    builder = BatchBuilder(ctypes.addressof(batch), capacity)
    builder.clear()
    builder.add(token, pos, seq_id, logits=True)              # a decode row
    last = builder.add_span(prompt, start, n, pos0, seq_id, logits_last=True)  # a prefill chunk
    llama_cpp.llama_decode(ctx, batch)

The builder does not own the batch: keep the ctypes struct alive, and call
``llama_batch_free`` only after the last use of the builder. ``capacity`` must not exceed
the ``n_tokens`` the batch was initialised with, and the batch must have room for at least
one sequence id per row (``n_seq_max >= 1``). The struct's ``n_tokens`` is the builder's
only state, so rows are counted correctly even if another writer clears it.
"""

from __future__ import annotations

from typing import Final

BATCH_STRUCT_SIZE: Final[int]
"""``sizeof(llama_batch)`` as compiled here."""

BATCH_FIELD_OFFSETS: Final[dict[str, int]]
"""Byte offset of each ``llama_batch`` field as compiled here."""

class BatchBuilder:
    """Appends rows (token, position, one sequence id, logits flag) to a ``llama_batch``."""

    def __init__(self, batch_address: int, capacity: int) -> None:
        """Wrap the batch at ``batch_address`` (``ctypes.addressof`` of the struct).

        ``ValueError`` if the address is 0, ``capacity < 1``, or the batch has no token arrays
        (it was made for embeddings).
        """
    @property
    def n_tokens(self) -> int:
        """Rows written since the last ``clear`` (the struct's ``n_tokens``)."""
    @property
    def capacity(self) -> int:
        """Most rows the batch takes."""
    @property
    def free(self) -> int:
        """``capacity - n_tokens``."""
    def clear(self) -> None:
        """Start a new batch: ``n_tokens = 0``."""
    def add(self, token: int, pos: int, seq_id: int, logits: bool) -> int:
        """Append one row; returns its index.

        ``IndexError`` when the batch is full; ``ValueError`` for a negative ``pos`` or
        ``seq_id``; ``OverflowError`` for a value outside int32.
        """
    def add_span(
        self,
        tokens: list[int],
        start: int,
        count: int,
        pos0: int,
        seq_id: int,
        logits_last: bool,
        logits_all: bool = False,
    ) -> int:
        """Append ``tokens[start:start + count]`` at positions ``pos0, pos0 + 1, ...``, all in
        ``seq_id``; only the last row asks for logits, and only if ``logits_last``, unless
        ``logits_all`` (every row asks: prompt logprobs need them).

        Returns the last row's index. All or nothing: ``IndexError`` if the rows do not fit,
        ``ValueError`` if ``count < 1``, the slice leaves ``tokens``, or ``pos0``/``seq_id`` is
        negative; the batch is unchanged then.
        """
