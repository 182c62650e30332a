"""The engine's door to llama.cpp: model, context, batch and KV memory (samplers: ``sampler``).

Everything here is a thin, typed wrapper over llama-cpp-python's low-level ctypes API, so the
scheduling code above it can be read (and tested) without knowing ctypes.
"""

from __future__ import annotations

import ctypes
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import llama_cpp
import numpy as np
import numpy.typing as npt

from tinyserve.config import Config
from tinyserve.engine.runtime.sampler import Sampler, Vocab
from tinyserve.engine.runtime.weights import (
    GpuSpec,
    check_gpu,
    flash_attention,
    load_model,
    repack_weights,
)
from tinyserve.errors import EngineFatalError, RequestError
from tinyserve.model import resolve_model_path
from tinyserve.options import DEFAULT_CTX_FLOOR, DEFAULT_CTX_MEMORY_SHARE
from tinyserve.protocol import SamplingParams
from tinyserve_native.batch_builder import BatchBuilder

log = logging.getLogger(__name__)

# ggml_log_level: 1 debug, 2 info, 3 warn, 4 error, 5 continuation. Its info is our debug.
_LLAMA_LOG_LEVELS = {3: logging.WARNING, 4: logging.ERROR}
_PIECE_BUF = 256  # bytes; grown when a token's text is longer
# llama.cpp pads each stream's cells to a multiple of this (src/llama-context.cpp:
# ``n_ctx_seq = GGML_PAD(n_ctx / n_seq_max, 256)``).
KV_STREAM_PAD = 256
# --kv-type: ggml's type and the bytes of 32 elements (a q8_0 block is 32 int8 and an f16
# scale, a q4_0 block 16 bytes of nibbles and the scale).
KV_TYPES = {
    "f16": (llama_cpp.GGML_TYPE_F16, 64),
    "q8_0": (llama_cpp.GGML_TYPE_Q8_0, 34),
    "q4_0": (llama_cpp.GGML_TYPE_Q4_0, 18),
}


@dataclass(frozen=True)
class RuntimeSpec:
    """What the runtime needs to open a context; derived once from the engine's config."""

    model_path: Path
    slots: int  # sequences, each with a KV stream of its own
    ctx_per_slot: int  # cells of each; 0: the model's training context, capped
    n_batch: int
    n_threads: int
    repack: str = "auto"  # llama.cpp's weight repacking: "on", "off", or off where the CPU has AMX
    gpu: GpuSpec = field(default_factory=GpuSpec)
    kv_type: str = "f16"  # the cells' type: f16, q8_0 or q4_0
    flash_attn: str = "auto"  # "on", "off", or off where the CPU alone holds f16 cells

    @classmethod
    def from_config(cls, config: Config, model: str | None = None) -> RuntimeSpec:
        """The served model's spec, or with ``model`` another's (a draft model) on the same
        slots, cells per slot, batch and threads."""
        return cls(
            resolve_model_path(model or config.model),
            config.slots,
            config.ctx_per_slot,
            config.max_batch_tokens,
            config.engine_threads,
            config.repack,
            GpuSpec.from_config(config),
            config.kv_type,
            config.flash_attn,
        )


@dataclass(frozen=True)
class KvMemory:
    """The KV cells llama.cpp allocates up front: ``slots`` streams of ``cells`` each."""

    slots: int
    cells: int
    cell_bytes: int  # K and V of one token in every layer, as the model's shapes give them

    @property
    def bytes(self) -> int:
        return self.slots * self.cells * self.cell_bytes

    def __str__(self) -> str:
        return f"{self.slots} slots x {self.cells} cells, {self.bytes / 2**20:.0f} MiB"


def _route_llama_log(level: int, text: bytes, _user: ctypes.c_void_p) -> None:
    # llama.cpp is chatty at load; keep its lines at debug unless they are warnings or errors.
    message = text.decode("utf-8", "replace").rstrip()
    if message:
        log.log(_LLAMA_LOG_LEVELS.get(level, logging.DEBUG), "%s", message)


# the callback object must outlive every llama.cpp call, so it lives at module level.
_LOG_CALLBACK = llama_cpp.llama_log_callback(_route_llama_log)


class LlamaRuntime:
    """The model, one context (a stream of KV cells per slot), and one reusable batch."""

    def __init__(self, spec: RuntimeSpec) -> None:
        llama_cpp.llama_log_set(_LOG_CALLBACK, ctypes.c_void_p(0))
        llama_cpp.llama_backend_init()
        check_gpu(spec.gpu)
        self.spec = spec
        self.model = load_model(spec.model_path, repack_weights(spec.repack), spec.gpu)
        self._vocab = llama_cpp.llama_model_get_vocab(self.model)
        self.n_vocab = int(llama_cpp.llama_vocab_n_tokens(self._vocab))
        self.n_layer = int(llama_cpp.llama_model_n_layer(self.model))
        self.eog_tokens = [
            t for t in range(self.n_vocab) if llama_cpp.llama_vocab_is_eog(self._vocab, t)
        ]
        self._eog = frozenset(self.eog_tokens)
        self._pieces: dict[int, bytes] = {}  # each token's text, rendered once
        self.kv = self._kv_memory(spec)
        self.ctx = self._new_context(spec, self.kv)
        self.n_ctx_seq = int(llama_cpp.llama_n_ctx_seq(self.ctx))  # cells one sequence may use
        self._memory = llama_cpp.llama_get_memory(self.ctx)
        # llama.cpp caps n_batch at n_ctx, and asserts (aborts) on a bigger batch: use its figure.
        n_batch = min(spec.n_batch, int(llama_cpp.llama_n_batch(self.ctx)))
        self._batch = llama_cpp.llama_batch_init(n_batch, 0, 1)
        self.batch = BatchBuilder(ctypes.addressof(self._batch), n_batch)
        self._piece = ctypes.create_string_buffer(_PIECE_BUF)
        self._state: npt.NDArray[np.uint8] = np.empty(0, np.uint8)  # save_seq's, reused
        log.info(
            "model loaded: %s (KV cache: %s of %s; flash attention %s; n_batch=%d, "
            "threads=%d, gpu_layers=%s)",
            spec.model_path.name,
            self.kv,
            spec.kv_type,
            {1: "on", 0: "off"}.get(self.kv_types["flash_attn"], "llama.cpp's auto"),
            n_batch,
            spec.n_threads,
            "all" if spec.gpu.layers < 0 else spec.gpu.layers,
        )

    def _kv_memory(self, spec: RuntimeSpec) -> KvMemory:
        """What the KV cache will take, refused with one line when the memory is not there
        (on the CPU: llama.cpp would be killed writing zeros into it, not refused)."""
        train = int(llama_cpp.llama_model_n_ctx_train(self.model))
        cell_bytes, available = self._cell_bytes(), _available_memory()
        cells = spec.ctx_per_slot or default_cells(train, spec.slots, cell_bytes, available)
        cells = -(-cells // KV_STREAM_PAD) * KV_STREAM_PAD  # llama.cpp pads each stream so
        kv = KvMemory(spec.slots, cells, cell_bytes)
        if spec.gpu.layers == 0 and available is not None and kv.bytes > available:
            raise EngineFatalError(
                f"the KV cache ({kv}) does not fit in the {available / 2**20:.0f} MiB of memory "
                "available: lower --slots or --ctx-per-slot"
            )
        return kv

    def _cell_bytes(self) -> int:
        """K and V bytes of one token in all layers, in the cells' type."""
        arch = self._meta("general.architecture")
        heads = int(llama_cpp.llama_model_n_head(self.model))
        default = int(llama_cpp.llama_model_n_embd(self.model)) // max(heads, 1)
        k = int(self._meta(f"{arch}.attention.key_length") or default)
        v = int(self._meta(f"{arch}.attention.value_length") or default)
        elements = self.n_layer * int(llama_cpp.llama_model_n_head_kv(self.model)) * (k + v)
        return elements * KV_TYPES[self.spec.kv_type][1] // 32

    def _meta(self, key: str) -> str:
        buf = ctypes.create_string_buffer(256)
        n = llama_cpp.llama_model_meta_val_str(self.model, key.encode(), buf, len(buf))
        return buf.value.decode() if n >= 0 else ""

    def _new_context(self, spec: RuntimeSpec, kv: KvMemory) -> llama_cpp.llama_context_p:
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = kv.slots * kv.cells
        params.n_batch = spec.n_batch
        params.n_ubatch = spec.n_batch
        params.n_seq_max = kv.slots
        # a stream of cells per sequence: each running sequence attends over its own
        # cells only (one shared pool makes every row of a step attend over all of them).
        params.kv_unified = False
        params.n_threads = spec.n_threads
        params.n_threads_batch = spec.n_threads
        params.no_perf = True
        kv_type = KV_TYPES[spec.kv_type][0]
        params.type_k = params.type_v = kv_type
        params.flash_attn_type = flash_attention(spec.flash_attn, spec.kv_type, spec.gpu)
        # What the KV bytes' layout depends on (cache_store keys saved KV by it).
        self.kv_types = {
            "type_k": int(params.type_k),
            "type_v": int(params.type_v),
            "flash_attn": int(params.flash_attn_type),
        }
        ctx: llama_cpp.llama_context_p = llama_cpp.llama_init_from_model(self.model, params)
        if not ctx:
            raise EngineFatalError(
                f"llama.cpp could not create a context with a KV cache of {kv}: lower --slots "
                "or --ctx-per-slot"
            )
        return ctx

    def vocab_mismatch(self, other: LlamaRuntime) -> str:
        """Why ``other``'s tokens do not mean this model's, or "": llama.cpp's rule for a
        draft model (``common_speculative_are_compatible``)."""
        mine, theirs = self._vocab, other._vocab
        for what, get in (
            ("vocabulary type", llama_cpp.llama_vocab_type),
            ("adds a beginning token", llama_cpp.llama_vocab_get_add_bos),
            ("beginning token", llama_cpp.llama_vocab_bos),
            ("adds an end token", llama_cpp.llama_vocab_get_add_eos),
            ("end token", llama_cpp.llama_vocab_eos),
        ):
            if get(mine) != get(theirs):
                return f"its {what} is {get(theirs)}, the served model's {get(mine)}"
        if abs(self.n_vocab - other.n_vocab) > 128:
            return f"it has {other.n_vocab} tokens, the served model {self.n_vocab}"
        for token in range(5, min(self.n_vocab, other.n_vocab)):
            text = (llama_cpp.llama_vocab_get_text(v, token) for v in (theirs, mine))
            if len(set(text)) > 1:
                return f"its token {token} is not the served model's token {token}"
        return ""

    def decode(self) -> int:
        """Run the rows written into ``self.batch``; returns llama_decode's status code."""
        return int(llama_cpp.llama_decode(self.ctx, self._batch))

    def new_sampler(self, params: SamplingParams) -> Sampler:
        return Sampler(params, Vocab(self._vocab, self.n_vocab, self.eog_tokens))

    def is_eog(self, token: int) -> bool:
        return token in self._eog

    def piece(self, token: int) -> bytes:
        """The raw bytes of one token (may be part of a UTF-8 character), however long."""
        text = self._pieces.get(token)
        if text is None:
            text = self._pieces[token] = self._render(token)
        return text

    def _render(self, token: int) -> bytes:
        if not 0 <= token < self.n_vocab:
            # llama.cpp would throw a C++ exception for it, which ends the process.
            raise RequestError(f"token {token} is outside the vocabulary")
        n = self._token_to_piece(token)
        if n < 0:  # the buffer is too small: llama.cpp returns minus the size it needs
            self._piece = ctypes.create_string_buffer(-n)
            n = self._token_to_piece(token)
        if n < 0:
            raise RequestError(f"llama.cpp could not render token {token} ({n})")
        return self._piece.raw[:n]

    def _token_to_piece(self, token: int) -> int:
        size = len(self._piece)
        return int(llama_cpp.llama_token_to_piece(self._vocab, token, self._piece, size, 0, False))

    def logits(self, row: int) -> npt.NDArray[np.float32]:
        """The logits of one batch row: a view into llama.cpp's buffer, valid until the next
        decode call."""
        ptr = llama_cpp.llama_get_logits_ith(self.ctx, row)
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))

    def argmax(self, rows: list[int]) -> list[int]:
        """The highest logit's token of each of ``rows`` (batch rows with logits), in one
        numpy pass over llama.cpp's output buffer (the first highest, as its greedy stage)."""
        base = llama_cpp.llama_get_logits(self.ctx)
        start = _address(base) or 0
        row_bytes = self.n_vocab * ctypes.sizeof(ctypes.c_float)
        outputs = [
            ((_address(llama_cpp.llama_get_logits_ith(self.ctx, row)) or 0) - start) // row_bytes
            for row in rows
        ]
        logits = np.ctypeslib.as_array(base, shape=(max(outputs) + 1, self.n_vocab))
        best = logits.argmax(axis=1)
        return [int(best[output]) for output in outputs]

    def logits_rows(self, first: int, n: int) -> npt.NDArray[np.float32]:
        """The logits of batch rows ``first .. first + n - 1``, all of which asked for logits,
        as an ``(n, n_vocab)`` array (a view while llama.cpp stores them contiguously)."""
        start = llama_cpp.llama_get_logits_ith(self.ctx, first)
        end = llama_cpp.llama_get_logits_ith(self.ctx, first + n - 1)
        row_bytes = self.n_vocab * ctypes.sizeof(ctypes.c_float)
        gap = (_address(end) or 0) - (_address(start) or 0)
        if start and gap == (n - 1) * row_bytes:
            return np.ctypeslib.as_array(start, shape=(n, self.n_vocab))
        return np.stack([self.logits(first + i) for i in range(n)])

    def logprobs(self, row: int, token: int, top_n: int) -> list[Any]:
        """``[logprob of token, [[id, logprob], ...] top_n best]`` under the model's raw
        distribution for batch row ``row`` (before temperature or other sampling steps)."""
        return self.logprobs_rows(row, [token], top_n)[0]

    def logprobs_rows(self, first: int, tokens: list[int], top_n: int) -> list[list[Any]]:
        """``logprobs`` for consecutive rows from ``first``: row ``first + i`` scores
        ``tokens[i]``. One vectorised pass, for a prompt chunk's rows at once."""
        if top_n >= self.n_vocab:
            raise RequestError(f"logprobs={top_n}: the vocabulary has {self.n_vocab} tokens")
        n = len(tokens)
        logits = self.logits_rows(first, n).astype(np.float64)
        peak = logits.max(axis=1, keepdims=True)
        logprobs = logits - (peak + np.log(np.exp(logits - peak).sum(axis=1, keepdims=True)))
        chosen = logprobs[np.arange(n), tokens]
        entries: list[list[Any]] = []
        for i in range(n):
            best: list[list[float]] = []
            if top_n > 0:
                ids = np.argpartition(-logprobs[i], top_n)[:top_n]
                ids = ids[np.argsort(-logprobs[i][ids])]
                best = [[int(t), float(logprobs[i][t])] for t in ids]
            entries.append([float(chosen[i]), best])
        return entries

    def forget(self, seq_id: int, start: int = -1, end: int = -1) -> None:
        """Drop ``seq_id``'s KV cells in ``[start, end)`` (all of them by default)."""
        llama_cpp.llama_memory_seq_rm(self._memory, seq_id, start, end)

    def clear(self) -> None:
        """Drop every sequence's KV cells: a fresh start for a new scheduler."""
        llama_cpp.llama_memory_clear(self._memory, True)

    def share(self, src: int, dst: int, end: int) -> None:
        """Give ``dst`` a copy of ``src``'s cells below position ``end``, in place of all it
        had. NOTE: llama.cpp copies between streams only whole (the copy happens at the next
        decode) and aborts the process if asked for part of one: copy it all, then drop the
        rest."""
        llama_cpp.llama_memory_seq_cp(self._memory, src, dst, -1, -1)
        self.forget(dst, end)

    def save_seq(self, seq_id: int) -> npt.NDArray[np.uint8]:
        """The KV of every cell ``seq_id`` holds, with their positions, as llama.cpp writes it
        (``llama_state_seq_get_data``), valid until the next call: the buffer is reused,
        since fresh pages cost more here than the copy itself."""
        size = int(llama_cpp.llama_state_seq_get_size(self.ctx, seq_id))
        if len(self._state) < size:
            self._state = np.empty(size, np.uint8)
        pointer = self._state.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8))
        written = int(llama_cpp.llama_state_seq_get_data(self.ctx, pointer, size, seq_id))
        return self._state[:written]

    def load_seq(self, seq_id: int, state: npt.NDArray[np.uint8]) -> bool:
        """Give ``seq_id`` (whose cells llama.cpp drops first) the cells of a saved state, at
        their positions; False if llama.cpp refused it (it checks the layer count, cell sizes
        and types, and that its stream has room)."""
        pointer = state.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8))
        return int(llama_cpp.llama_state_seq_set_data(self.ctx, pointer, len(state), seq_id)) > 0

    def close(self) -> None:
        llama_cpp.llama_batch_free(self._batch)
        llama_cpp.llama_free(self.ctx)
        llama_cpp.llama_model_free(self.model)


def llama_cpp_version() -> str:
    """The llama-cpp-python release (and so the llama.cpp sources) this engine runs on."""
    return str(llama_cpp.__version__)


def default_cells(train: int, slots: int, cell_bytes: int, available: int | None) -> int:
    """A slot's cells under ``--ctx-per-slot 0``: the training context, or as many as a share
    of the ``available`` memory holds for every slot (never under the floor)."""
    if available is None:
        return train
    fits = int(available * DEFAULT_CTX_MEMORY_SHARE) // (slots * cell_bytes)
    return min(train, max(fits // KV_STREAM_PAD * KV_STREAM_PAD, DEFAULT_CTX_FLOOR))


def _available_memory(meminfo: Path = Path("/proc/meminfo")) -> int | None:
    """Bytes the kernel says can be had without swapping (``MemAvailable``), or None."""
    try:
        match = re.search(r"^MemAvailable:\s+(\d+) kB", meminfo.read_text(), re.MULTILINE)
    except OSError:
        return None
    return int(match.group(1)) * 1024 if match else None


def _address(pointer: Any) -> int | None:
    return ctypes.cast(pointer, ctypes.c_void_p).value
