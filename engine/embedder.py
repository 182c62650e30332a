"""Embeddings: each input's hidden states pooled into one vector, in a llama.cpp context of
their own.

The generation context's cells belong to the slots, and an embedding keeps no KV once its
vector is out, so ``/v1/embeddings`` runs in a second context: on the served model's weights
(the same memory, nothing loaded twice) or on ``--embedding-model``'s. It is made at the first
request, so a server that never embeds pays nothing for it, and it runs at most one batch
(``--embedding-max-tokens`` tokens, ``EMBED_SEQS`` inputs) per engine tick, between the
generation ticks: a long list of inputs delays running streams by one such batch per tick,
never by the whole list. While any generation request waits or runs, the batch holds at most
``--chunk`` tokens (whole inputs, at least one): what a prompt chunk costs a step.

Pooling is the GGUF's (``{arch}.pooling_type``), or mean where it names none (a chat model);
``--pooling`` picks one. Vectors go out L2-normalised, as OpenAI's and llama-server's do.
"""

from __future__ import annotations

import ctypes
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import llama_cpp
import numpy as np
import numpy.typing as npt

from tinyserve.config import Config
from tinyserve.engine.weights import GpuSpec, load_model, repack_weights
from tinyserve.errors import RequestError
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

EMBED_SEQS = 32  # inputs in one embedding batch at most
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


@dataclass(frozen=True, slots=True)
class EmbedBatch:
    """One embedding batch the tick ran (for the metrics)."""

    inputs: int
    tokens: int
    seconds: float


class EmbeddingContext:
    """A llama.cpp context whose outputs are pooled embeddings; ``run`` embeds one batch."""

    def __init__(self, spec: EmbedSpec, model: llama_cpp.llama_model_p) -> None:
        self.n_embd = int(llama_cpp.llama_model_n_embd_out(model))
        self.pooling = pooling_of(model, spec.pooling)
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = params.n_batch = params.n_ubatch = spec.max_tokens
        params.n_seq_max = EMBED_SEQS
        params.kv_unified = True  # one pool of cells, emptied before each batch
        params.embeddings = True
        params.pooling_type = self.pooling
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

    def run(self, inputs: list[list[int]]) -> list[npt.NDArray[np.float32]]:
        """The L2-normalised pooled vector of each input; together they fit one batch."""
        batch = self.batch
        batch.clear()
        for seq_id, tokens in enumerate(inputs):
            # every row an output: pooling reads each token's hidden state
            batch.add_span(tokens, 0, len(tokens), 0, seq_id, False, True)
        llama_cpp.llama_memory_clear(self._memory, True)
        status = int(llama_cpp.llama_decode(self.ctx, self._batch))
        if status != 0:
            raise RequestError(f"llama_decode returned {status} for an embedding batch")
        vectors = []
        for seq_id in range(len(inputs)):
            pointer = llama_cpp.llama_get_embeddings_seq(self.ctx, seq_id)
            if not pointer:
                raise RequestError("llama.cpp returned no pooled embedding")
            vector = np.ctypeslib.as_array(pointer, shape=(self.n_embd,)).astype(np.float32)
            norm = float(np.linalg.norm(vector))
            vectors.append(vector / norm if norm > 0 else vector)
        return vectors

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


def _meta(model: llama_cpp.llama_model_p, key: str) -> str:
    buf = ctypes.create_string_buffer(256)
    n = llama_cpp.llama_model_meta_val_str(model, key.encode(), buf, len(buf))
    return buf.value.decode() if n >= 0 else ""


@dataclass(eq=False, slots=True)
class _Job:
    request: Embed
    vectors: list[bytes] = field(default_factory=list)
    tokens: int = 0


class Embeddings:
    """The engine's embedding requests, first come first served, and the context they run in.

    Every request that comes in gets exactly one ``Embedded``: from ``submit`` at once when
    it is refused, from ``step`` when its last vector is out or its batch failed, from
    ``cancel`` (and the rest) when it is stopped. ``--embedding-model``'s weights are loaded
    here, at start-up, so a wrong path stops the engine at once; the context waits for the
    first request."""

    def __init__(
        self,
        spec: EmbedSpec,
        served_model: llama_cpp.llama_model_p,
        served_n_vocab: int,
        max_queue: int,
    ) -> None:
        self.spec = spec
        self._max_queue = max_queue
        self._own_model = spec.model_path is not None
        self.model = served_model
        self.n_vocab = served_n_vocab
        if spec.model_path is not None:
            self.model = load_model(spec.model_path, repack_weights(spec.repack), spec.gpu)
            vocab = llama_cpp.llama_model_get_vocab(self.model)
            self.n_vocab = int(llama_cpp.llama_vocab_n_tokens(vocab))
        # dimensions of a vector (the frontends check a request's ``dimensions`` against it)
        self.size = int(llama_cpp.llama_model_n_embd_out(self.model)) if self.model else 0
        self._jobs: deque[_Job] = deque()
        self._context: EmbeddingContext | None = None

    def __bool__(self) -> bool:
        return bool(self._jobs)

    def __len__(self) -> int:
        return len(self._jobs)

    def submit(self, request: Embed, draining: bool) -> Embedded | None:
        """Queue ``request``; at once its end instead when it is refused (the engine drains,
        the queue is full) or cannot run as sent."""
        if draining:
            return _ended(request, FINISH_REJECTED, REJECT_DRAINING)
        if len(self._jobs) >= self._max_queue:
            return _ended(request, FINISH_REJECTED, REJECT_QUEUE_FULL)
        fault = self._fault(request)
        if fault:
            return _ended(request, FINISH_ERROR, fault)
        self._jobs.append(_Job(request))
        return None

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

    def cancel(self, request_id: str, reason: str) -> Embedded | None:
        for job in self._jobs:
            if job.request.request_id == request_id:
                self._jobs.remove(job)
                return _ended(job.request, reason)
        return None

    def cancel_frontend(self, frontend_id: str, reason: str) -> list[Embedded]:
        gone = [job for job in self._jobs if job.request.frontend_id == frontend_id]
        for job in gone:
            self._jobs.remove(job)
        return [_ended(job.request, reason, "frontend gone") for job in gone]

    def end_all(self, reason: str, detail: str) -> list[Embedded]:
        ended = [_ended(job.request, reason, detail) for job in self._jobs]
        self._jobs.clear()
        return ended

    def step(self, tokens: int = 0) -> tuple[list[Embedded], EmbedBatch | None]:
        """Run one batch of the oldest inputs, at most ``tokens`` tokens when given (and at
        least one input): the requests that ended, and the batch."""
        try:
            context = self._open()
        except RequestError as exc:  # every waiting request would fail the same way
            log.error("embedding context failed: %s", exc)
            return self.end_all(FINISH_ERROR, str(exc)), None
        inputs, owners = self._next_batch(min(tokens or self.spec.max_tokens, self.spec.max_tokens))
        started = time.perf_counter()
        try:
            vectors = context.run(inputs)
        except RequestError as exc:  # the batch's requests end; the engine goes on
            log.error("embedding batch failed: %s", exc)
            return [self._end(job, FINISH_ERROR, str(exc)) for job in dict.fromkeys(owners)], None
        seconds = time.perf_counter() - started
        for job, ids, vector in zip(owners, inputs, vectors, strict=True):
            job.vectors.append(vector.astype("<f4").tobytes())
            job.tokens += len(ids)
        done = [job for job in dict.fromkeys(owners) if len(job.vectors) == len(job.request.inputs)]
        ended = [self._end(job, FINISH_STOP) for job in done]
        return ended, EmbedBatch(len(inputs), sum(map(len, inputs)), seconds)

    def _next_batch(self, room: int) -> tuple[list[list[int]], list[_Job]]:
        """The oldest inputs not yet embedded, as many as ``room`` tokens hold (at least one),
        and the job of each."""
        inputs: list[list[int]] = []
        owners: list[_Job] = []
        for job in self._jobs:
            for ids in job.request.inputs[len(job.vectors) :]:
                if (inputs and len(ids) > room) or len(inputs) == EMBED_SEQS:
                    return inputs, owners
                inputs.append(ids)
                owners.append(job)
                room -= len(ids)
        return inputs, owners

    def _end(self, job: _Job, reason: str, detail: str = "") -> Embedded:
        self._jobs.remove(job)
        if reason != FINISH_STOP:
            return _ended(job.request, reason, detail)
        request = job.request
        return Embedded(request.frontend_id, request.request_id, reason, job.vectors, job.tokens)

    def _open(self) -> EmbeddingContext:
        if self._context is None:
            self._context = EmbeddingContext(self.spec, self.model)
            log.info(
                "embedding context ready: %d tokens per batch, %d dimensions, pooling %d",
                self.spec.max_tokens,
                self._context.n_embd,
                self._context.pooling,
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
