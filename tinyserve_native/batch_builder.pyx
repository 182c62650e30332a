"""Writes token rows straight into the arrays of a llama.cpp ``llama_batch``.

This runs every engine tick, so a row costs a few C stores and no Python objects.
"""

from libc.stdint cimport INT32_MAX, int32_t, uintptr_t

cdef llama_batch _probe


cdef size_t _offset(void *field) noexcept:
    return <size_t>(<char *>field - <char *>&_probe)


# Exposed so tests can compare the declared layout with llama_cpp's ctypes mirror.
BATCH_STRUCT_SIZE = sizeof(llama_batch)
BATCH_FIELD_OFFSETS = {
    "n_tokens": _offset(&_probe.n_tokens),
    "token": _offset(&_probe.token),
    "embd": _offset(&_probe.embd),
    "pos": _offset(&_probe.pos),
    "n_seq_id": _offset(&_probe.n_seq_id),
    "seq_id": _offset(&_probe.seq_id),
    "logits": _offset(&_probe.logits),
}


cdef class BatchBuilder:
    """Appends rows (token, position, one sequence id, logits flag) to a ``llama_batch``."""

    def __cinit__(self, uintptr_t batch_address, long long capacity):
        if batch_address == 0:
            raise ValueError("batch_address is NULL")
        if capacity <= 0 or capacity > INT32_MAX:
            raise ValueError(f"capacity must be in 1..{INT32_MAX}, got {capacity}")
        cdef llama_batch *batch = <llama_batch *>batch_address
        if (batch.token == NULL or batch.pos == NULL or batch.n_seq_id == NULL
                or batch.seq_id == NULL or batch.logits == NULL):
            raise ValueError("batch has no token arrays (made for embeddings, or not initialised)")
        self._batch = batch
        self._capacity = <int32_t>capacity

    @property
    def n_tokens(self) -> int:
        return self._batch.n_tokens

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def free(self) -> int:
        return self._capacity - self._batch.n_tokens

    def clear(self) -> None:
        """Start a new batch: zero rows."""
        self._batch.n_tokens = 0

    def add(self, int32_t token, int32_t pos, int32_t seq_id, bint logits) -> int:
        """Append one row; returns its index."""
        if pos < 0 or seq_id < 0:
            raise ValueError(f"pos and seq_id must be >= 0, got {pos} and {seq_id}")
        cdef int32_t row = self._first_free_row(1)
        self._write_row(row, token, pos, seq_id, logits)
        self._batch.n_tokens = row + 1
        return row

    def add_span(
        self,
        list tokens not None,
        Py_ssize_t start,
        Py_ssize_t count,
        int32_t pos0,
        int32_t seq_id,
        bint logits_last,
        bint logits_all=False,
    ) -> int:
        """Append ``tokens[start:start + count]`` at positions ``pos0..``; returns the last row."""
        if count <= 0:
            raise ValueError(f"count must be >= 1, got {count}")
        if start < 0 or start > len(tokens) - count:
            raise ValueError(f"tokens[{start}:{start + count}] is outside a list of {len(tokens)}")
        if pos0 < 0 or seq_id < 0:
            raise ValueError(f"pos0 and seq_id must be >= 0, got {pos0} and {seq_id}")
        if pos0 > INT32_MAX - count:
            raise ValueError(f"positions from {pos0} for {count} tokens overflow int32")
        cdef int32_t row0 = self._first_free_row(count)
        cdef int32_t i
        cdef int32_t token
        for i in range(<int32_t>count):
            # NOTE: a token that does not convert raises here, before n_tokens moves, so the
            # rows written so far stay outside the batch: "write nothing" holds.
            token = tokens[start + i]
            self._write_row(row0 + i, token, pos0 + i, seq_id, logits_all)
        cdef int32_t last = row0 + <int32_t>count - 1
        self._batch.logits[last] = logits_last or logits_all
        self._batch.n_tokens = last + 1
        return last

    cdef int32_t _first_free_row(self, Py_ssize_t count) except -1:
        cdef int32_t n = self._batch.n_tokens
        if n < 0 or n > self._capacity - count:
            raise IndexError(
                f"batch full: {count} rows do not fit ({n} of {self._capacity} used)"
            )
        return n

    cdef void _write_row(
        self, int32_t row, int32_t token, int32_t pos, int32_t seq_id, bint logits
    ) noexcept:
        self._batch.token[row] = token
        self._batch.pos[row] = pos
        self._batch.n_seq_id[row] = 1
        self._batch.seq_id[row][0] = seq_id
        self._batch.logits[row] = logits
