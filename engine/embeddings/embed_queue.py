"""The embedding requests: queued and ordered by the scheduling policy, cut into each tick's
part, and recorded in a timeline like a generation's. Transport-free and model-free: the
context that computes a part is ``embedder.EmbeddingContext``.

Each request is a ``Sequence`` (its inputs end to end as the prompt, no output), so the policy
that orders generation requests (``--policy``, its tenant weights and priorities) orders
these too, in a queue of their own: an embedding request takes no slot, and waits for its turn
among embedding requests only. Taken from the queue, it runs (``PREFILL``) until its last
input's vector is out; requests run in the order the policy took them, inputs in their order,
so at most one input is ever part done: the last one a part began.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from tinyserve.config import Config
from tinyserve.engine.request.sequence import Sequence, SequenceStatus
from tinyserve.engine.request.timeline import RecentTimelines
from tinyserve.engine.scheduling.policies import make_policy
from tinyserve.protocol import FINISH_STOP, Embed, Embedded, SamplingParams, Submit

EMBED_SEQS = 32  # inputs in one embedding part at most: the context's sequences


@dataclass(eq=False, slots=True)
class EmbedJob:
    """One embedding request in the engine."""

    request: Embed
    seq: Sequence  # its place in the policy's queue, and its timeline
    vectors: list[bytes] = field(default_factory=list)
    done: int = 0  # tokens of its current input (the next without a vector) embedded
    pooled: npt.NDArray[np.float64] | None = None  # the current input's pooled so far
    tokens: int = 0  # tokens embedded in all

    @property
    def current(self) -> list[int]:
        return self.request.inputs[len(self.vectors)]

    @property
    def finished(self) -> bool:
        return len(self.vectors) == len(self.request.inputs)


@dataclass(frozen=True, slots=True)
class Piece:
    """Tokens ``start`` to ``start + n`` of input ``index`` of ``job``, in one part, as the
    context's sequence ``seq_id`` (its place in the part: a split input is always first, 0)."""

    job: EmbedJob
    index: int
    start: int
    n: int
    seq_id: int

    @property
    def ids(self) -> list[int]:
        return self.job.request.inputs[self.index]

    @property
    def last(self) -> bool:
        """The input's last tokens: its vector is out after this part."""
        return self.start + self.n == len(self.ids)


def as_sequence(request: Embed, policy: str) -> Sequence:
    """``request`` as the policy and the timeline see it: its inputs as one prompt."""
    prompt = [token for ids in request.inputs for token in ids]
    submit = Submit(
        request.request_id, request.frontend_id, prompt, SamplingParams(), 0,
        request.priority, request.tenant, request.arrival_ns,
    )  # fmt: skip
    return Sequence(submit, policy_name=policy)


class EmbedQueue:
    """Waiting and running embedding requests. Single-threaded, like the engine loop."""

    def __init__(self, config: Config, recent: RecentTimelines, splits: bool, mean: bool) -> None:
        self.policy = make_policy(config.policy, config.tenant_weight_map, config.srpt_aging)
        self.recent = recent
        self.splits = splits  # an input may be split across parts (its pooling allows it)
        self.mean = mean  # an input's vector is the mean of its tokens' (else its last part's)
        self.running: list[EmbedJob] = []  # in the order the policy took them
        self.by_id: dict[str, EmbedJob] = {}
        self._arrivals = 0
        self._taken = 0

    def __len__(self) -> int:
        return len(self.by_id)

    def waiting(self) -> int:
        return len(self.policy)

    def queued(self) -> Iterator[Sequence]:
        return iter(self.policy)

    def add(self, request: Embed, tick: int, now: int) -> None:
        seq = as_sequence(request, self.policy.name)
        self._arrivals += 1
        seq.order = self._arrivals
        seq.timeline.accept(tick, now, self._taken, len(self.running), len(self.policy))
        self.by_id[request.request_id] = EmbedJob(request, seq)
        self.policy.add(seq)
        seq.status = SequenceStatus.WAITING

    def plan(self, room: int, tick: int, now: int) -> list[Piece]:
        """This tick's part: at most ``room`` tokens, of the running requests first, then of
        the ones the policy takes. Only a part's first piece may be less than a whole input
        (or, without ``splits``, more than ``room``): a split input's cells are then always
        its part's first, in order, and no other sequence's come and go between them, which
        keeps its vector what it is whole (llama.cpp's attention sums cells in their order)."""
        pieces: list[Piece] = []
        for job in self._jobs(tick, now):
            start = job.done
            for index in range(len(job.vectors), len(job.request.inputs)):
                n = len(job.request.inputs[index]) - start
                if n > room and pieces:
                    return pieces
                if n > room and self.splits:
                    n = room
                pieces.append(Piece(job, index, start, n, len(pieces)))
                room -= n
                if room <= 0 or len(pieces) == EMBED_SEQS:
                    return pieces
                start = 0
        return pieces

    def _jobs(self, tick: int, now: int) -> Iterator[EmbedJob]:
        yield from list(self.running)
        while (seq := self.policy.pop_next()) is not None:
            job = self.by_id[seq.request_id]
            seq.status = SequenceStatus.PREFILL
            seq.timeline.grant(tick, now, -1, self.policy.rule(seq), self._taken)
            self._taken += 1
            self.running.append(job)
            yield job

    def took(
        self, pieces: list[Piece], vectors: list[npt.NDArray[np.float64]], tick: int, now: int,
        decode_ns: int,
    ) -> list[EmbedJob]:  # fmt: skip
        """Each piece's pooled vector folded into its input's: the requests whose last vector
        is out."""
        tokens: dict[EmbedJob, int] = {}
        for piece, vector in zip(pieces, vectors, strict=True):
            job = piece.job
            pooled = vector * piece.n
            if self.mean and job.pooled is not None:
                pooled += job.pooled
            tokens[job] = tokens.get(job, 0) + piece.n
            if piece.last:
                job.vectors.append(_unit(pooled).astype("<f4").tobytes())
                job.pooled, job.done = None, 0
            else:
                job.pooled, job.done = pooled, piece.start + piece.n
        for job, n in tokens.items():
            job.tokens += n
            job.seq.timeline.prefill_chunk(tick, n, now, decode_ns)
            self.policy.charge(job.seq, n)
        return [job for job in tokens if job.finished]

    def split(self) -> bool:
        """Whether an input is part done: its cells are the context's only ones."""
        return any(job.done for job in self.running)

    def end(self, job: EmbedJob, reason: str, detail: str, tick: int, now: int) -> Embedded:
        """Take ``job`` out, record its timeline; its one ``Embedded``."""
        del self.by_id[job.request.request_id]
        seq = job.seq
        self.policy.remove(seq)
        if seq.status is SequenceStatus.PREFILL:
            self.running.remove(job)
        seq.status = SequenceStatus.FINISHED
        seq.timeline.end(reason, detail, tick, now, 0)
        self.recent.add(job.request.request_id, seq.timeline.to_dict())
        request = job.request
        if reason != FINISH_STOP:
            return Embedded(request.frontend_id, request.request_id, reason, detail=detail)
        return Embedded(request.frontend_id, request.request_id, reason, job.vectors, job.tokens)


def _unit(vector: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """``vector`` L2-normalised (as OpenAI's and llama-server's are)."""
    norm = float(np.linalg.norm(vector))
    return vector / norm if norm > 0 else vector
