"""The engine's door to llama.cpp: model, context, batch and KV memory (samplers: ``sampler``).

Everything here is a thin, typed wrapper over llama-cpp-python's low-level ctypes API, so the
scheduling code above it can be read (and tested) without knowing ctypes.
"""

from __future__ import annotations

import ctypes
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import llama_cpp
import numpy as np
import numpy.typing as npt

from tinyserve.config import Config
from tinyserve.engine.sampler import Sampler, Vocab
from tinyserve.errors import EngineFatalError, ModelNotFoundError, RequestError
from tinyserve.model import resolve_model_path
from tinyserve.protocol import SamplingParams
from tinyserve_native.batch_builder import BatchBuilder

log = logging.getLogger(__name__)

# ggml_log_level: 1 debug, 2 info, 3 warn, 4 error, 5 continuation. Its info is our debug.
_LLAMA_LOG_LEVELS = {3: logging.WARNING, 4: logging.ERROR}
_PIECE_BUF = 256  # bytes; grown when a token's text is longer


@dataclass(frozen=True)
class RuntimeSpec:
    """What the runtime needs to open a context; derived once from the engine's config."""

    model_path: Path
    n_ctx: int
    n_seq_max: int
    n_batch: int
    n_threads: int
    repack: str = "auto"  # llama.cpp's weight repacking: "on", "off", or off where the CPU has AMX
    unified: bool = True  # one pool of KV cells for all sequences, else n_ctx/n_seq_max each

    @classmethod
    def from_config(cls, config: Config) -> RuntimeSpec:
        return cls(
            resolve_model_path(config.model),
            config.ctx,
            config.n_seq_max,
            config.max_batch_tokens,
            config.engine_threads,
            config.repack,
            config.kv_layout == "unified",
        )


def _route_llama_log(level: int, text: bytes, _user: ctypes.c_void_p) -> None:
    # llama.cpp is chatty at load; keep its lines at debug unless they are warnings or errors.
    message = text.decode("utf-8", "replace").rstrip()
    if message:
        log.log(_LLAMA_LOG_LEVELS.get(level, logging.DEBUG), "%s", message)


# NOTE: the callback object must outlive every llama.cpp call, so it lives at module level.
_LOG_CALLBACK = llama_cpp.llama_log_callback(_route_llama_log)


def model_params(repack: bool) -> llama_cpp.llama_model_params:
    """How llama.cpp loads the weights: on the CPU, repacked into its extra buffer types
    (AMX, CPU_REPACK) only when ``repack``."""
    params: llama_cpp.llama_model_params = llama_cpp.llama_model_default_params()
    params.n_gpu_layers = 0
    params.use_extra_bufts = repack
    return params


def repack_weights(mode: str) -> bool:
    """Whether to repack: ``on``/``off`` as given; ``auto`` repacks unless the CPU has AMX.
    NOTE: with the weights repacked for AMX, the vendored llama.cpp's AMX matmul segfaults on
    the first batch of more than one token (seen on this project's Xeon VMs with amx_tile;
    llama.cpp issue 20824 reports the same crash, unfixed), which would end the engine."""
    if mode != "auto":
        return mode == "on"
    if not cpu_has_amx():
        return True
    log.warning("weight repacking off: this CPU has AMX, whose kernels crash here (--repack on)")
    return False


def cpu_has_amx(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    try:
        text = cpuinfo.read_text()
    except OSError:
        return False
    return re.search(r"^flags\s*:.*\bamx_tile\b", text, re.MULTILINE) is not None


class LlamaRuntime:
    """The model, one context (KV cells in one pool, or a stream per sequence id), and one
    reusable batch."""

    def __init__(self, spec: RuntimeSpec) -> None:
        llama_cpp.llama_log_set(_LOG_CALLBACK, ctypes.c_void_p(0))
        llama_cpp.llama_backend_init()
        self.spec = spec
        self._model = self._load_model(spec.model_path, repack_weights(spec.repack))
        self._vocab = llama_cpp.llama_model_get_vocab(self._model)
        self.n_vocab = int(llama_cpp.llama_vocab_n_tokens(self._vocab))
        self.eog_tokens = [t for t in range(self.n_vocab) if self.is_eog(t)]
        self.ctx = self._new_context(spec)
        self.n_ctx = int(llama_cpp.llama_n_ctx(self.ctx))  # cells of all sequences
        self.n_ctx_seq = int(llama_cpp.llama_n_ctx_seq(self.ctx))  # cells one sequence may use
        self._memory = llama_cpp.llama_get_memory(self.ctx)
        # llama.cpp caps n_batch at n_ctx, and asserts (aborts) on a bigger batch: use its figure.
        n_batch = min(spec.n_batch, int(llama_cpp.llama_n_batch(self.ctx)))
        self._batch = llama_cpp.llama_batch_init(n_batch, 0, 1)
        self.batch = BatchBuilder(ctypes.addressof(self._batch), n_batch)
        self._piece = ctypes.create_string_buffer(_PIECE_BUF)
        log.info(
            "model loaded: %s (n_ctx=%d, %s, n_seq_max=%d, n_batch=%d, threads=%d)",
            spec.model_path.name,
            self.n_ctx,
            "unified" if spec.unified else f"{self.n_ctx_seq} cells per sequence",
            spec.n_seq_max,
            spec.n_batch,
            spec.n_threads,
        )

    @staticmethod
    def _load_model(path: Path, repack: bool) -> llama_cpp.llama_model_p:
        model: llama_cpp.llama_model_p = llama_cpp.llama_model_load_from_file(
            str(path).encode(), model_params(repack)
        )
        if not model:
            raise ModelNotFoundError(f"llama.cpp could not load model file: {path}")
        return model

    def _new_context(self, spec: RuntimeSpec) -> llama_cpp.llama_context_p:
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = spec.n_ctx
        params.n_batch = spec.n_batch
        params.n_ubatch = spec.n_batch
        params.n_seq_max = spec.n_seq_max
        # NOTE: unified, one pool of KV cells for all sequences, which the prefix cache shares
        # and one request may fill; otherwise llama.cpp splits n_ctx evenly per sequence id
        # (a stream each), and a sequence's attention spans its own cells only.
        params.kv_unified = spec.unified
        params.n_threads = spec.n_threads
        params.n_threads_batch = spec.n_threads
        params.no_perf = True
        # What the KV bytes' layout depends on (cache_store keys saved KV by it).
        self.kv_layout = {
            "type_k": int(params.type_k),
            "type_v": int(params.type_v),
            "flash_attn": int(params.flash_attn_type),
        }
        ctx: llama_cpp.llama_context_p = llama_cpp.llama_init_from_model(self._model, params)
        if not ctx:
            raise EngineFatalError("llama.cpp could not create a context")
        return ctx

    def decode(self) -> int:
        """Run the rows written into ``self.batch``; returns llama_decode's status code."""
        return int(llama_cpp.llama_decode(self.ctx, self._batch))

    def new_sampler(self, params: SamplingParams) -> Sampler:
        return Sampler(params, Vocab(self._vocab, self.n_vocab, self.eog_tokens))

    def is_eog(self, token: int) -> bool:
        return bool(llama_cpp.llama_vocab_is_eog(self._vocab, token))

    def piece(self, token: int) -> bytes:
        """The raw bytes of one token (may be part of a UTF-8 character), however long."""
        if not 0 <= token < self.n_vocab:
            # NOTE: llama.cpp would throw a C++ exception for it, which ends the process.
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

    def share(self, src: int, dst: int, start: int, end: int) -> None:
        """Let ``dst`` see ``src``'s cells in ``[start, end)``: no copy in a unified cache;
        with a stream per sequence, a copy of ``src``'s (made at the next decode) in place
        of all ``dst`` had."""
        if self.spec.unified:
            llama_cpp.llama_memory_seq_cp(self._memory, src, dst, start, end)
            return
        # NOTE: llama.cpp copies between streams only whole, and aborts the process if asked
        # for part of one: copy it all, then drop what is outside [start, end).
        llama_cpp.llama_memory_seq_cp(self._memory, src, dst, -1, -1)
        if start > 0:
            self.forget(dst, 0, start)
        self.forget(dst, end)

    def save_seq(self, seq_id: int) -> bytes:
        """The KV of every cell ``seq_id`` sees, with their positions, as llama.cpp writes it
        (``llama_state_seq_get_data``): what ``load_seq`` takes back."""
        size = int(llama_cpp.llama_state_seq_get_size(self.ctx, seq_id))
        buf = (ctypes.c_uint8 * size)()
        written = int(llama_cpp.llama_state_seq_get_data(self.ctx, buf, size, seq_id))
        return ctypes.string_at(buf, written)

    def load_seq(self, seq_id: int, data: bytes) -> bool:
        """Give ``seq_id`` (whose cells llama.cpp drops first) the cells ``save_seq`` wrote,
        at their positions, in free cells; False if llama.cpp refused the data (it checks
        the layer count, cell sizes and types, and that enough cells are free)."""
        buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        return int(llama_cpp.llama_state_seq_set_data(self.ctx, buf, len(data), seq_id)) > 0

    def close(self) -> None:
        llama_cpp.llama_batch_free(self._batch)
        llama_cpp.llama_free(self.ctx)
        llama_cpp.llama_model_free(self._model)


def llama_cpp_version() -> str:
    """The llama-cpp-python release (and so the llama.cpp sources) this engine runs on."""
    return str(llama_cpp.__version__)


def _address(pointer: Any) -> int | None:
    return ctypes.cast(pointer, ctypes.c_void_p).value
