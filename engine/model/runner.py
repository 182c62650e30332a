"""The runner: writes the batch the scheduler planned, decodes it, samples. It decides nothing.

For each planned row it returns what it computed: the token a sequence sampled (with its
text, whether it ends generation, and its logprobs when asked) and a prompt chunk's prompt
logprobs when asked. What follows from them (a stop string, ``max_tokens``, the end of a
prompt) is the scheduler's to decide. A row that fails (its sampler, its logprobs) carries the
exception, so the scheduler ends that request alone.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from tinyserve.engine.output.report import Batch
from tinyserve.engine.request import prompt_logprobs
from tinyserve.engine.request.sequence import Sequence, SequenceStatus
from tinyserve.engine.runtime.runtime import LlamaRuntime
from tinyserve.engine.runtime.sampler import Sampler

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Row:
    """The plan for one sequence in a tick: ``n_tokens`` rows from its ``n_past`` on (its last
    token and its ``guess``, or a prompt chunk), a token sampled from the last one when
    ``sample``."""

    seq: Sequence
    n_tokens: int
    sample: bool
    guess: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Sampled:
    """A sampled token: its text (none for an end-of-generation token), and its logprobs
    (``[logprob, [[id, logprob], ...]]``) when the request asked for them."""

    token: int
    text: bytes
    end: bool
    logprobs: list[Any] | None


@dataclass(slots=True)
class Computed:
    """What the runner computed for one planned row; ``error`` when that failed."""

    row: Row
    logits_row: int = -1  # the batch row its token was sampled from
    sampled: Sampled | None = None
    # The model's picks after each guessed token, for as long as the guess agreed with them:
    # the tokens that follow ``sampled``.
    confirmed: list[Sampled] = field(default_factory=list)
    prompt_logprobs: list[list[Any]] | None = None
    error: Exception | None = None


@dataclass(frozen=True, slots=True)
class Outcome:
    """One decode: llama_decode's status (0: done), each row's results, the batch's sizes."""

    status: int
    computed: list[Computed]
    batch: Batch


def time_rows(runtime: LlamaRuntime, token: int, pos: int, seq_id: int, rows: int) -> float:
    """Seconds ``runtime`` takes to write ``rows`` rows of ``token`` with logits at ``pos``
    on in ``seq_id``'s cells, decode them and pick from each, those cells dropped after; -1
    when the decode fails."""
    builder = runtime.batch
    builder.clear()
    started = time.perf_counter()
    for i in range(rows):
        builder.add(token, pos + i, seq_id, True)
    status = runtime.decode()
    if status == 0:
        runtime.argmax(list(range(rows)))
    elapsed = time.perf_counter() - started
    runtime.forget(seq_id, pos)
    builder.clear()
    return elapsed if status == 0 else -1.0


class Runner:
    """Batch, decode and sampling over ``LlamaRuntime``; holds each slot's sampler."""

    def __init__(self, runtime: LlamaRuntime) -> None:
        self.runtime = runtime
        self.samplers: dict[int, Sampler] = {}  # by slot

    def start(self, seq: Sequence) -> None:
        """``seq`` holds its slot: its sampler chain (and grammar) is built now."""
        self.samplers[seq.slot] = sampler = self.runtime.new_sampler(seq.request.sampling)
        seq.timeline.grammar = sampler.grammar

    def stop(self, seq: Sequence) -> None:
        sampler = self.samplers.pop(seq.slot, None)  # None when the grant failed before it
        if sampler is not None:
            sampler.free()

    def run(self, plan: list[Row]) -> Outcome:
        """Write ``plan``'s rows (in its order), decode once, sample what was asked."""
        self.runtime.batch.clear()
        computed = [self._write(row) for row in plan]
        started = time.perf_counter()
        status = self.runtime.decode()
        elapsed = time.perf_counter() - started
        written = [c for c in computed if c.error is None]
        if status == 0:
            self._compute(written)
        tokens = sum(c.row.n_tokens for c in written)
        decoding = sum(c.row.n_tokens for c in written if c.row.seq.status is SequenceStatus.DECODE)
        batch = Batch(len(written), tokens, tokens - decoding, decoding, elapsed)
        return Outcome(status, computed, batch)

    def time_rows(self, seq: Sequence, rows: int) -> float:
        """Seconds a step of ``rows`` rows with logits of ``seq`` takes the runner (written at
        its next positions, decoded, picked), those cells dropped after: a measurement for
        speculation's step cost, outside any tick's plan."""
        return time_rows(self.runtime, seq.last_token, seq.n_past, seq.slot, rows)

    def sample(self, seq: Sequence, logits_row: int) -> Sampled:
        """``seq``'s next token from the logits of ``logits_row`` of the last decode."""
        return self._sampled(
            seq, logits_row, self.samplers[seq.slot].sample(self.runtime.ctx, logits_row)
        )

    def _sampled(self, seq: Sequence, logits_row: int, token: int) -> Sampled:
        top_n = seq.request.sampling.logprobs
        logprobs = self.runtime.logprobs(logits_row, token, top_n) if top_n >= 0 else None
        end = self.runtime.is_eog(token)
        return Sampled(token, b"" if end else self.runtime.piece(token), end, logprobs)

    def _write(self, row: Row) -> Computed:
        seq, builder = row.seq, self.runtime.batch
        try:
            if seq.status is SequenceStatus.DECODE:
                last = builder.add(seq.last_token, seq.n_past, seq.slot, True)
                for i, token in enumerate(row.guess, seq.n_past + 1):
                    builder.add(token, i, seq.slot, True)  # its rows follow ``last``
            else:
                every = prompt_logprobs.wanted(seq)
                prompt = seq.request.prompt_ids
                last = builder.add_span(
                    prompt, seq.n_past, row.n_tokens, seq.n_past, seq.slot, row.sample, every
                )
        except Exception as exc:  # the row's failure is its request's alone
            return Computed(row, error=exc)
        return Computed(row, last)

    def _compute(self, written: list[Computed]) -> None:
        """Each row's prompt logprobs and token; the plain greedy ones' tokens in one pass."""
        tokens = self._greedy_tokens(written)
        for item in written:
            seq = item.row.seq
            try:
                if seq.status is SequenceStatus.PREFILL and prompt_logprobs.wanted(seq):
                    item.prompt_logprobs = prompt_logprobs.chunk_entries(
                        self.runtime, seq, item.logits_row, item.row.n_tokens
                    )
                token = tokens.get(id(item))
                if item.row.guess:
                    self._verify(item)
                elif token is not None:
                    self.samplers[seq.slot].took(token)
                    item.sampled = self._sampled(seq, item.logits_row, token)
                elif item.row.sample:
                    item.sampled = self.sample(seq, item.logits_row)
            except Exception as exc:  # the row's failure is its request's alone
                item.error = exc

    def _verify(self, item: Computed) -> None:
        """The sequence's pick after its last token and after each guessed one, for as long as
        the guess agrees: a guessed token is confirmed when it is what the sequence's sampler
        picked there. Each row is sampled as it would be without guesses (the same chain, its
        random stream drawn once per token taken, grammar and penalties told each token in
        turn), so the reply is the one the request gives without speculation."""
        seq, guess, first = item.row.seq, item.row.guess, item.logits_row
        sampler = self.samplers[seq.slot]
        rows = list(range(first, first + len(guess) + 1))
        # plain greedy stays so to the end: the pick of every row at once
        picks = self.runtime.argmax(rows) if sampler.greedy else None
        for i, row in enumerate(rows):
            if picks is None:
                sampled = self.sample(seq, row)
            else:
                sampler.took(picks[i])
                sampled = self._sampled(seq, row, picks[i])
            if i == 0:
                item.sampled = sampled
            else:
                item.confirmed.append(sampled)
            if i == len(guess) or sampled.token != guess[i] or sampled.end:
                return

    def _greedy_tokens(self, written: list[Computed]) -> dict[int, int]:
        """The tokens of the rows whose sampler is plain greedy, by ``id`` of their item: one
        argmax over the outputs (~15 us a row, against ~130 us for a sampler chain). Should it
        fail, each row samples on its own, where its failure is its own."""
        greedy = [
            c
            for c in written
            if c.row.sample and not c.row.guess and self.samplers[c.row.seq.slot].greedy
        ]
        if not greedy:
            return {}
        try:
            picked = self.runtime.argmax([c.logits_row for c in greedy])
        except Exception:
            log.exception("greedy rows picked one by one")
            return {}
        return {id(item): token for item, token in zip(greedy, picked, strict=True)}
