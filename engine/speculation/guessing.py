"""The scheduler's side of speculation: which sequences guess, how many tokens each tick, and
where the guesses come from (their own text, engine/request/speculation.py's lookup, or the
draft model, engine/speculation/draft_model.py). What a guess is worth is learnt here too:
``StepCost`` hears the duration of every decode-only tick."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable

from tinyserve.engine.request.sequence import Sequence
from tinyserve.engine.request.speculation import CALIBRATION_ROWS, Speculation, StepCost
from tinyserve.engine.speculation.draft_model import Ask, DraftModel


class Guessing:
    """Each tick's guesses for the decoding sequences, and the step cost they are paid from."""

    def __init__(
        self,
        mode: str,
        max_k: int,
        n_ctx: int,
        time_rows: Callable[[Sequence, int], float],
        draft_model: DraftModel | None = None,
    ) -> None:
        self.on = mode != "off"
        self.max_k = max_k
        self.n_ctx = n_ctx
        self.time_rows = time_rows  # the runner's timing of a step of so many rows
        self.draft_model = draft_model  # guesses from a smaller model, else from the text
        self.step_cost = StepCost()
        self._decode_only_since = 0  # the end of the last tick, when it decoded only
        # What a decode of the draft model costs (engine/speculation/draft_model.py), fitted as the
        # target's is from a calibration; and its seconds in the current tick, a guess's
        # cost beside its row, not a step's.
        self.draft_cost = StepCost()
        self._draft_s = 0.0

    def tick_ended(self, decode_only: bool, rows: int, now: int) -> None:
        """A tick of ``rows`` rows ended at ``now``. From the end of one decode-only tick to
        the end of the next is the engine's whole work for a step (its loop, the sends, the
        runner): what a guessed token saves."""
        if decode_only and self._decode_only_since:
            seconds = (now - self._decode_only_since) / 1e9 - self._draft_s
            self.step_cost.observe(rows, seconds)
        self._decode_only_since = now if decode_only else 0
        self._draft_s = 0.0

    def other_work(self) -> None:
        """Work that is no decode step (an embedding batch) ran since the last tick: the
        time to the next one says nothing of a step's cost."""
        self._decode_only_since = 0

    def start(self, seq: Sequence) -> None:
        """``seq`` starts decoding: it guesses from now on, unless ``--speculate off``."""
        if not self.on:
            return
        if self.draft_model is not None:  # guesses come from the draft: no lookup to keep
            seq.spec = Speculation(self.max_k, lookup=None)
        else:
            seq.spec = Speculation(self.max_k)
            seq.spec.heard(seq.request.prompt_ids)

    def _draft_per_token(self, batch: int) -> float:
        """Seconds the draft model spends on a guessed token when ``batch`` sequences guess
        together (a draft decode picks one token for each): 0 without a draft."""
        if self.draft_model is None:
            return 0.0
        if not self.draft_cost.calibrated:
            self.draft_cost.calibrate(self.draft_model.time_rows)
        fitted = self.draft_cost.fit()
        if fitted is None:
            return 0.0
        fixed, per_row = fitted
        return fixed / max(batch, 1) + per_row

    def guesses(self, decoding: list[Sequence], spare: int) -> dict[int, tuple[int, ...]]:
        """The decoding sequences' guessed next tokens for this tick, by slot: each as many as
        pay at the step's bar, within the ``spare`` rows of the budget, its slot's cells and
        its ``max_tokens``."""
        if not self.step_cost.calibrated:  # before the first guess: what a row costs
            fits = (s for s in decoding if s.spec and s.n_past + CALIBRATION_ROWS < self.n_ctx)
            seq = next(fits, None)
            if seq is not None:
                self.step_cost.calibrate(functools.partial(self.time_rows, seq))
        bar = self.step_cost.bar(len(decoding), self._draft_per_token(len(decoding)))
        apart = self.step_cost.apart(len(decoding))
        guesses: dict[int, tuple[int, ...]] = {}
        asks: list[Ask] = []
        for seq in decoding:
            spec = seq.spec
            if spec is None:
                continue
            room = min(
                spare,
                self.n_ctx - seq.n_past - 2,  # its last token's cell, then one per guess
                seq.request.max_tokens - seq.generated - 1,
            )
            if self.draft_model is None:
                guess = spec.guess(room, bar, apart)
                guesses[seq.slot] = tuple(guess)
                spare -= len(guess)
                continue
            k = spec.wanted(room, bar, apart)
            if k:
                asks.append(Ask(seq.slot, seq.request.prompt_ids + seq.output_ids, k))
                spare -= k
        if asks:
            assert self.draft_model is not None
            started = time.perf_counter()
            drafted = self.draft_model.guesses(asks)
            self._draft_s = time.perf_counter() - started
            guesses.update((slot, tuple(guess)) for slot, guess in drafted.items())
        return guesses
