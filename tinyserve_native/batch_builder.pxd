# Layout of llama.cpp's batch and of the builder that fills it; see batch_builder.pyi.

from libc.stdint cimport int8_t, int32_t


# NOTE: must match `struct llama_batch` in llama.h field for field (llama_token, llama_pos
# and llama_seq_id are all int32_t there). The tests compare it with llama_cpp's ctypes
# mirror of the struct, offsets included.
ctypedef struct llama_batch:
    int32_t n_tokens
    int32_t *token
    float *embd
    int32_t *pos
    int32_t *n_seq_id
    int32_t **seq_id
    int8_t *logits


cdef class BatchBuilder:
    cdef llama_batch *_batch
    cdef int32_t _capacity

    cdef int32_t _first_free_row(self, Py_ssize_t count) except -1
    cdef void _write_row(
        self, int32_t row, int32_t token, int32_t pos, int32_t seq_id, bint logits
    ) noexcept
