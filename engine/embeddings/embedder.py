"""Embeddings: each input's hidden states pooled into one vector, in a llama.cpp context of
their own, a tick's part at a time.

The generation context's cells belong to the slots, and an embedding keeps no KV once its
vector is out, so ``/v1/embeddings`` runs in a second context: on the served model's weights
(the same memory, nothing loaded twice) or on ``--embedding-model``'s. It is made at the first
request, so a server that never embeds pays nothing for it. The requests are queued and
ordered by the scheduling policy (``embed_queue.py``); each tick runs one part of them, as
many tokens as ``EmbedShare`` (``embed_share.py``) gives it: a whole batch
(``--embedding-max-tokens``) when no generation request waits or runs, else at most
``--embedding-tick-tokens``, and only while embeddings are owed their ``--embedding-share`` of
the engine's time.

A long input is split across parts where its pooling allows it: mean or last pooling on a
causal model (a generation model; its GGUF names no pooling type), whose tokens' hidden states
depend on the tokens before them only, kept as KV cells between parts. Its vector is the mean
of its parts' means weighted by their tokens, or its last part's. Elsewhere (an embedding
model that names its pooling, cls pooling) a part holds whole inputs, its first whatever its
length, so one input may make a tick's part longer than ``--embedding-tick-tokens``.

Pooling is the GGUF's (``{arch}.pooling_type``), or mean where it names none (a chat model);
``--pooling`` picks one. Vectors go out L2-normalised, as OpenAI's and llama-server's do.
"""

from __future__ import annotations

import ctypes
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import llama_cpp
import numpy as np
import numpy.typing as npt

from tinyserve import capacity
from tinyserve.config import Config
from tinyserve.engine.embeddings.embed_queue import EMBED_SEQS, EmbedJob, EmbedQueue, Piece
from tinyserve.engine.embeddings.embed_share import EmbedShare
from tinyserve.engine.output.report import EmbedBatch
from tinyserve.engine.request.sequence import Sequence
from tinyserve.engine.request.timeline import RecentTimelines
from tinyserve.engine.runtime.weights import GpuSpec, load_model, repack_weights
from tinyserve.errors import RequestError
from tinyserve.logs import fields
from tinyserve.model import resolve_model_path
from tinyserve.protocol import (
    FINISH_ERROR,
    FINISH_REJECTED,
    FINISH_STOP,
    REJECT_DRAINING,
    REJECT_QUEUE_FULL,
    Embed,
    Embedded,
)
from tinyserve_native.batch_builder import BatchBuilder

log = logging.getLogger(__name__)

POOLINGS = {
    "mean": llama_cpp.LLAMA_POOLING_TYPE_MEAN,
    "cls": llama_cpp.LLAMA_POOLING_TYPE_CLS,
    "last": llama_cpp.LLAMA_POOLING_TYPE_LAST,
}


@dataclass(frozen=True)
class EmbedSpec:
    """What the embedding context needs; derived once from the engine's config."""

    model_path: Path | None  # None: the served model's weights
    pooling: str  # auto, or a key of POOLINGS
    max_tokens: int  # cells, and tokens of one batch: the longest input
    n_threads: int
    repack: str = "auto"
    gpu: GpuSpec = field(default_factory=GpuSpec)

    @classmethod
    def from_config(cls, config: Config) -> EmbedSpec:
        path = resolve_model_path(config.embedding_model) if config.embedding_model else None
        return cls(
            path,
            config.pooling,
            config.embedding_max_tokens,
            config.engine_threads,
            config.repack,
            GpuSpec.from_config(config),
        )


class EmbeddingContext:
    """A llama.cpp context whose outputs are pooled embeddings; ``run`` embeds one part."""

    def __init__(self, spec: EmbedSpec, model: llama_cpp.llama_model_p, pooling: int) -> None:
        self.n_embd = int(llama_cpp.llama_model_n_embd_out(model))
        self.pooling = pooling
        params = llama_cpp.llama_context_default_params()
        # cells for a part and for the input a part left half done; a batch size that is no
        # multiple of 32 aborts the process in llama.cpp's pooling (a matrix of the wrong shape)
        rows = -(-spec.max_tokens // 32) * 32
        params.n_ctx = 2 * rows
        params.n_batch = params.n_ubatch = rows
        params.n_seq_max = EMBED_SEQS
        params.kv_unified = True  # one pool of cells, emptied whenever no input is half done
        params.embeddings = True
        params.pooling_type = pooling
        params.n_threads = params.n_threads_batch = spec.n_threads
        params.no_perf = True
        self.ctx = llama_cpp.llama_init_from_model(model, params)
        if not self.ctx:
            raise RequestError(
                f"llama.cpp could not create the embedding context ({spec.max_tokens} tokens): "
                "lower --embedding-max-tokens"
            )
        self._memory = llama_cpp.llama_get_memory(self.ctx)  # None for encoder-only models
        self._batch = llama_cpp.llama_batch_init(spec.max_tokens, 0, 1)
        self.batch = BatchBuilder(ctypes.addressof(self._batch), spec.max_tokens)

    def run(self, pieces: list[Piece]) -> list[npt.NDArray[np.float64]]:
        """Each piece's pooled vector (of its tokens in this part); together they fit one
        batch, and a piece that goes on with an input follows that input's cells."""
        batch = self.batch
        batch.clear()
        for piece in pieces:
            # every row an output: pooling reads each token's hidden state
            batch.add_span(piece.ids, piece.start, piece.n, piece.start, piece.seq_id, False, True)
        status = int(llama_cpp.llama_decode(self.ctx, self._batch))
        if status != 0:
            raise RequestError(f"llama_decode returned {status} for an embedding batch")
        vectors = []
        for piece in pieces:
            pointer = llama_cpp.llama_get_embeddings_seq(self.ctx, piece.seq_id)
            if not pointer:
                raise RequestError("llama.cpp returned no pooled embedding")
            vectors.append(np.ctypeslib.as_array(pointer, shape=(self.n_embd,)).astype(np.float64))
        return vectors

    def clear(self) -> None:
        if self._memory:
            llama_cpp.llama_memory_clear(self._memory, True)

    def close(self) -> None:
        llama_cpp.llama_batch_free(self._batch)
        llama_cpp.llama_free(self.ctx)


def pooling_of(model: llama_cpp.llama_model_p, choice: str) -> int:
    """llama.cpp's pooling type for ``choice``: auto takes the GGUF's ``{arch}.pooling_type``
    where it names mean, cls or last, else mean (chat models name none; rerankers rank)."""
    if choice != "auto":
        return POOLINGS[choice]
    arch = _meta(model, "general.architecture")
    named = _meta(model, f"{arch}.pooling_type")
    if named.isdigit() and int(named) in POOLINGS.values():
        return int(named)
    return llama_cpp.LLAMA_POOLING_TYPE_MEAN


def splits_inputs(model: llama_cpp.llama_model_p, pooling: int) -> bool:
    """Whether an input may be split across parts: mean or last pooling on a model whose
    GGUF names no pooling type (a generation model, causal: a token's hidden state depends
    on the tokens before it only, which its cells keep between parts)."""
    arch = _meta(model, "general.architecture")
    causal = not _meta(model, f"{arch}.pooling_type")
    return causal and pooling in (
        llama_cpp.LLAMA_POOLING_TYPE_MEAN,
        llama_cpp.LLAMA_POOLING_TYPE_LAST,
    )


def _meta(model: llama_cpp.llama_model_p, key: str) -> str:
    buf = ctypes.create_string_buffer(256)
    n = llama_cpp.llama_model_meta_val_str(model, key.encode(), buf, len(buf))
    return buf.value.decode() if n >= 0 else ""


class Embeddings:
    """The engine's embedding requests, the context they run in, and each tick's part.

    Every request that comes in gets exactly one ``Embedded``: from ``submit`` at once when
    it is refused, from ``step`` when its last vector is out or its part failed, from
    ``cancel`` (and the rest) when it is stopped. ``--embedding-model``'s weights are loaded
    here, at start-up, so a wrong path stops the engine at once; the context waits for the
    first request."""

    def __init__(
        self,
        spec: EmbedSpec,
        served_model: llama_cpp.llama_model_p,
        served_n_vocab: int,
        config: Config,
        recent: RecentTimelines,
    ) -> None:
        self.spec = spec
        self._max_queue = config.max_queue
        self._own_model = spec.model_path is not None
        self.model = served_model
        self.n_vocab = served_n_vocab
        if spec.model_path is not None:
            self.model = load_model(spec.model_path, repack_weights(spec.repack), spec.gpu)
            vocab = llama_cpp.llama_model_get_vocab(self.model)
            self.n_vocab = int(llama_cpp.llama_vocab_n_tokens(vocab))
        # dimensions of a vector (the frontends check a request's ``dimensions`` against it)
        self.size = int(llama_cpp.llama_model_n_embd_out(self.model)) if self.model else 0
        self.pooling = pooling_of(self.model, spec.pooling) if self.model else POOLINGS["mean"]
        splits = bool(self.model) and splits_inputs(self.model, self.pooling)
        mean = self.pooling == llama_cpp.LLAMA_POOLING_TYPE_MEAN
        self.queue = EmbedQueue(config, recent, splits, mean)
        self.share = EmbedShare(
            config.embedding_share,
            config.embedding_tick_tokens,
            spec.max_tokens,
            config.embedding_part_decodes,
        )
        self._context: EmbeddingContext | None = None

    def __bool__(self) -> bool:
        return bool(self.queue)

    def __len__(self) -> int:
        return len(self.queue)

    def submit(self, request: Embed, draining: bool, tick: int, now: int) -> Embedded | None:
        """Queue ``request``; at once its end instead when it is refused (the engine drains,
        the queue is full) or cannot run as sent."""
        if draining:
            return _ended(request, FINISH_REJECTED, REJECT_DRAINING)
        if request.request_id in self.queue.by_id:
            log.warning("duplicate request id ignored", extra=fields(id=request.request_id))
            return None
        if capacity.queue_full(self.queue.waiting(), 0, self._max_queue):
            return _ended(request, FINISH_REJECTED, REJECT_QUEUE_FULL)
        fault = self._fault(request)
        if fault:
            return _ended(request, FINISH_ERROR, fault)
        self.queue.add(request, tick, now)
        return None

    def live(self, request_id: str) -> Sequence | None:
        """The request as the policy and its timeline see it, while it is here."""
        job = self.queue.by_id.get(request_id)
        return None if job is None else job.seq

    def _fault(self, request: Embed) -> str:
        """What makes an ``Embed`` unsafe to run, or "". Our frontends check first; anything
        else that reaches the socket must not crash the engine."""
        limit = self.spec.max_tokens
        for ids in request.inputs:
            if not 0 < len(ids) <= limit:
                return f"an input has {len(ids)} tokens; 1 to {limit} (--embedding-max-tokens)"
            if not all(0 <= token < self.n_vocab for token in ids):
                return "an input's token id is outside the vocabulary"
        return "" if request.inputs else "no inputs"

    def cancel(self, request_id: str, reason: str, tick: int, now: int) -> Embedded | None:
        job = self.queue.by_id.get(request_id)
        return None if job is None else self._end(job, reason, "", tick, now)

    def cancel_frontend(self, frontend_id: str, reason: str, tick: int, now: int) -> list[Embedded]:
        gone = [job for job in self.queue.by_id.values() if job.request.frontend_id == frontend_id]
        return [self._end(job, reason, "frontend gone", tick, now) for job in gone]

    def end_all(self, reason: str, detail: str, tick: int, now: int) -> list[Embedded]:
        return [
            self._end(job, reason, detail, tick, now) for job in list(self.queue.by_id.values())
        ]

    def step(self, room: int, tick: int, now: int) -> tuple[list[Embedded], EmbedBatch | None]:
        """Run this tick's part, at most ``room`` tokens (at least one piece): the requests
        that ended, and the part."""
        try:
            context = self._open()
        except RequestError as exc:  # every waiting request would fail the same way
            log.error("embedding context failed: %s", exc)
            return self.end_all(FINISH_ERROR, str(exc), tick, now), None
        pieces = self.queue.plan(room, tick, now)
        started = time.perf_counter_ns()
        try:
            vectors = context.run(pieces)
        except RequestError as exc:  # the part's requests end; the engine goes on
            log.error("embedding batch failed: %s", exc)
            jobs = dict.fromkeys(piece.job for piece in pieces)
            context.clear()
            return [self._end(job, FINISH_ERROR, str(exc), tick, now) for job in jobs], None
        ns = time.perf_counter_ns() - started
        done = self.queue.took(pieces, vectors, tick, now, ns)
        ended = [self._end(job, FINISH_STOP, "", tick, now) for job in done]
        if not self.queue.split():
            context.clear()
        tokens = sum(piece.n for piece in pieces)
        inputs = sum(piece.last for piece in pieces)
        return ended, EmbedBatch(inputs, tokens, ns / 1e9, len(pieces))

    def _end(self, job: EmbedJob, reason: str, detail: str, tick: int, now: int) -> Embedded:
        if job.done and self._context is not None:
            self._context.clear()  # its half-done input's cells were the only ones
        return self.queue.end(job, reason, detail, tick, now)

    def _open(self) -> EmbeddingContext:
        if self._context is None:
            self._context = EmbeddingContext(self.spec, self.model, self.pooling)
            log.info(
                "embedding context ready: %d tokens per batch, %d dimensions, pooling %d, "
                "inputs split across ticks: %s",
                self.spec.max_tokens,
                self._context.n_embd,
                self._context.pooling,
                "yes" if self.queue.splits else "no",
            )
        return self._context

    def close(self) -> None:
        if self._context is not None:
            self._context.close()
            self._context = None
        if self._own_model:
            llama_cpp.llama_model_free(self.model)


def _ended(request: Embed, reason: str, detail: str = "") -> Embedded:
    return Embedded(request.frontend_id, request.request_id, reason, detail=detail)
