"""Prompt-lookup speculation: a sequence's next tokens guessed from its own text.

A sequence whose last few tokens (an n-gram, the longest of ``NGRAMS`` that matches) occurred
earlier in its prompt or output guesses that what followed them then follows now (vLLM's
``ngram`` speculator, llama.cpp's lookup decoding). The guesses ride as extra rows of the
sequence in the tick's one ``llama_decode``; the runner samples those rows in order with the
request's own sampler, and a guessed token is taken when the sampler picks it there. A guess
is one token, not a distribution, so this is the standard accept/reject rule for such a
draft: the guess ``g`` holds with the chance ``p(g)`` the sampler gives it, and otherwise the
token comes from ``p`` without ``g``. Because the sampler draws from its random stream once per
token taken, as it would without guesses, the rule here is that one draw's: a reply is the
same token for token with speculation on or off, greedy or sampled, for the same seed.

Never slower, by measuring. A guessed row costs what one more row costs the step, and pays
only when its token is taken. ``StepCost`` fits the time from one decode-only tick to the
next (the engine's loop, its sends and the runner) as ``fixed + per_row * rows``; a step of
``B`` decoding sequences gives each a token for ``(fixed + per_row * B) / B`` seconds, so a
guessed row is worth its ``per_row`` when the chance that its token is taken is above
``per_row * B / (fixed + per_row * B)``. On this project's 2-core CPU that bar is about 0.4
for one sequence and 0.85 among eight; where a row costs little more than nothing (a GPU's
small batches) it is near zero. Each sequence estimates, from its own recent
guesses of each kind (a match of 12 tokens, of 6, ...: ``Odds``), the chance that a guessed
token holds given the one before it did, and guesses as many tokens as keep the chance of
reaching them above the bar (the j-th is reached with that chance to the power j): a long
match guesses far where a 2-gram one, in the same text, may not pay at all. A kind whose
guesses do not pay is skipped for its next ``FIRST_PAUSE`` guesses, then tries one token to
learn again; each pause that ends in no guess worth making doubles the next (up to
``MAX_PAUSE``), so that probing costs next to nothing where text does not repeat. The
scheduler gives guesses only the step's token budget left after every decode row, and only in
a step with no prompt piece (engine/scheduling/pieces.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

# The n-gram lengths looked up, longest first. Each is a kind of guess with odds of its own:
# the longer the text that matched, the likelier what followed it then follows now (on the
# benchmark's story, 2-gram matches went on 37% of the time, 12-gram ones 99%).
NGRAMS = (12, 6, 3, 2)
DRAFT = 0  # the kind of a draft model's guesses
# The odds each kind starts from, as (held, failed).
PRIORS = {12: (6.0, 1.0), 6: (4.0, 1.0), 3: (2.0, 1.0), 2: (2.0, 1.0), DRAFT: (2.0, 1.0)}
FIRST_PAUSE = 8  # guesses skipped; each pause that ends in a guess not worth it doubles
MAX_PAUSE = 256
# How fast old evidence fades: a sequence's guesses and the engine's step times, per update.
DECAY = 0.7
COST_DECAY = 0.995
# The bar before the engine has timed steps of two sizes: one guessed token in two taken.
UNFITTED_BAR = 0.5
CALIBRATION_ROWS = 9  # a row and eight guesses
CALIBRATION_WEIGHT = 20.0


class Lookup:
    """Where each n-gram of a token list last occurred, for each length in ``NGRAMS``: the
    position of the token that followed it. Keys are the n-grams' hashes: two n-grams that
    share one cost a wrong guess, which its check refuses, never a wrong token."""

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self._next: dict[int, int] = {}

    def extend(self, tokens: list[int]) -> None:
        for token in tokens:
            self._append(token)

    def _append(self, token: int) -> None:
        # Index the n-grams that end just before ``token``: each now has a follower.
        tokens, end = self.tokens, len(self.tokens)
        for n in NGRAMS:
            if end >= n:
                self._next[hash((n, *tokens[end - n : end]))] = end
        tokens.append(token)

    def match(self) -> tuple[int, int] | None:
        """``(n, start)``: the longest n-gram the list ends with that occurred before, and
        where what followed it then starts; None when none did."""
        tokens, end = self.tokens, len(self.tokens)
        for n in NGRAMS:
            if end >= n:
                start = self._next.get(hash((n, *tokens[end - n : end])))
                if start is not None:
                    return n, start
        return None

    def follow(self, start: int, k: int) -> list[int]:
        """``k`` tokens from ``start`` on. A continuation that reaches the end of the list
        goes on into the guess itself: text that repeats with a period repeats on."""
        tokens, end = self.tokens, len(self.tokens)
        guess = tokens[start : start + k]
        while len(guess) < k:
            guess.append(guess[len(guess) - (end - start)])
        return guess


class StepCost:
    """A decode step's duration as ``fixed + per_row * rows``, fitted by least squares over
    the engine's steps without prompt tokens, recent ones weighing more, and seeded by a
    measurement of one row against ``CALIBRATION_ROWS`` (``calibrate``): steps of one size
    alone, as a lone sequence that never guesses makes, would leave the slope unknown."""

    def __init__(self) -> None:
        self._n = self._x = self._y = self._xx = self._xy = 0.0
        self.calibrated = False

    def calibrate(self, time_rows: Callable[[int], float]) -> None:
        """Time steps of 1 and ``CALIBRATION_ROWS`` rows (the best of three each) and count
        them as ``CALIBRATION_WEIGHT`` steps apiece."""
        self.calibrated = True
        for rows in (1, CALIBRATION_ROWS):
            best = min(time_rows(rows) for _ in range(3))
            if best < 0:
                return
            self.observe(rows, best, CALIBRATION_WEIGHT)

    def observe(self, rows: int, seconds: float, weight: float = 1.0) -> None:
        d = COST_DECAY
        self._n = self._n * d + weight
        self._x = self._x * d + weight * rows
        self._y = self._y * d + weight * seconds
        self._xx = self._xx * d + weight * rows * rows
        self._xy = self._xy * d + weight * rows * seconds

    def fit(self) -> tuple[float, float] | None:
        """``(fixed, per_row)`` in seconds, or None before steps of two sizes were timed."""
        spread = self._n * self._xx - self._x * self._x
        if spread <= 1e-9 * max(self._n * self._xx, 1.0):
            return None
        per_row = (self._n * self._xy - self._x * self._y) / spread
        fixed = (self._y - per_row * self._x) / self._n
        return max(fixed, 0.0), max(per_row, 0.0)

    def bar(self, batch: int, extra: float = 0.0) -> float:
        """The least chance of being taken at which a guessed token pays for its row (and
        ``extra`` seconds more of making it: a draft model's), in a step of ``batch``
        decoding sequences; 1 or more: no guess pays."""
        fitted = self.fit()
        if fitted is None:
            return UNFITTED_BAR
        fixed, per_row = fitted
        whole = fixed + per_row * batch
        return (per_row + extra) * batch / whole if whole > 0 else 0.0

    def apart(self, batch: int) -> float:
        """What a decode of its own costs the guesses of a step of ``batch`` decoding
        sequences, in tokens' worth: with a KV stream per slot llama.cpp splits a batch into
        ubatches of as many tokens from each sequence (``split_equal``), so the guesses of
        one sequence among several are a ``llama_decode`` graph of their own, its fixed part
        included. 0 for a lone sequence, whose guesses ride in its own ubatch."""
        fitted = self.fit()
        if fitted is None or batch <= 1:
            return 0.0
        fixed, per_row = fitted
        whole = fixed + per_row * batch
        return fixed * batch / whole if whole > 0 else 0.0


@dataclass
class Odds:
    """What recent guesses of one kind say of the next: the chance that a guessed token
    holds given that the one before it did, and the pauses of a kind that does not pay."""

    held: float  # guessed tokens taken, decayed (from a prior)
    failed: float  # guesses cut short by a wrong token, decayed
    cooldown: int = 0  # guesses of this kind to skip
    pause: int = FIRST_PAUSE  # how long the next pause is
    probing: bool = False  # the cooldown is over: one token, whatever the bar

    @property
    def chance(self) -> float:
        """The chance that a guessed token holds, given that the one before it did."""
        return self.held / (self.held + self.failed)

    def length(self, bar: float, max_k: int, apart: float = 0.0) -> int:
        """How many tokens to guess: as many as are reached with a chance above ``bar``, if
        the tokens they are expected to give beyond their rows' cost cover ``apart`` (the
        cost of their own decode, ``StepCost.apart``); else none."""
        q = self.chance
        if q <= bar or q <= 0:
            return 0
        reached = max_k if q >= 1 or bar <= 0 else math.floor(math.log(bar) / math.log(q))
        k = min(max_k, reached)
        if apart > 0 and sum(q**j - bar for j in range(1, k + 1)) <= apart:
            return 0
        return k

    def wanted(self, room: int, bar: float, max_k: int, apart: float = 0.0) -> int:
        """How many tokens to guess, at most ``room``: none while cooling down or when no
        guess would pay (which starts a cooldown); none at all, not even a probe, while the
        bar is 1 or more (a guess that always held would not pay) or the guesses would need
        a decode of their own (``apart``: a probe would cost its whole fixed part)."""
        if bar >= 1:
            return 0
        if self.cooldown:
            self.cooldown -= 1
            self.probing = self.cooldown == 0
            return 0
        k = self.length(bar, max_k, apart)
        if k:
            self.pause = FIRST_PAUSE  # guessing pays again
        elif apart > 0:
            return 0
        elif self.probing:
            k = 1  # the pause is over: one token, to learn whether guessing pays again
        else:
            # A probe costs a row too: where text does not repeat, the pauses grow until
            # the probes cost next to nothing.
            self.cooldown, self.pause = self.pause, min(self.pause * 2, MAX_PAUSE)
            return 0
        return max(0, min(k, room))

    def took(self, guessed: int, accepted: int) -> None:
        self.probing = False
        self.held = self.held * DECAY + accepted
        self.failed = self.failed * DECAY + (accepted < guessed)


@dataclass
class Speculation:
    """One sequence's guessing: its lookup, and the odds of each kind of guess it makes (a
    match of each n-gram length, or the draft model's, ``DRAFT``)."""

    max_k: int
    lookup: Lookup | None = field(default_factory=Lookup)  # None: the draft model guesses
    odds: dict[int, Odds] = field(init=False)  # by kind of guess
    kind: int = field(init=False)  # the kind of this tick's guess
    guessed: int = 0  # totals of what took() heard (the timeline keeps each step)
    accepted: int = 0

    def __post_init__(self) -> None:
        kinds = NGRAMS if self.lookup is not None else (DRAFT,)
        self.odds = {kind: Odds(*PRIORS[kind]) for kind in kinds}
        self.kind = kinds[-1]

    def heard(self, tokens: list[int]) -> None:
        """``tokens`` are now the sequence's: the lookup indexes them (when it keeps one)."""
        if self.lookup is not None:
            self.lookup.extend(tokens)

    def guess(self, room: int, bar: float, apart: float = 0.0) -> list[int]:
        """This tick's guess from the lookup, at most ``room`` tokens, as many as its kind
        of match pays for (``Odds.wanted``)."""
        assert self.lookup is not None
        found = self.lookup.match()
        if found is None:
            return []
        self.kind, start = found
        return self.lookup.follow(start, self.wanted(room, bar, apart))

    def wanted(self, room: int, bar: float, apart: float = 0.0) -> int:
        """How many tokens to guess this tick with this sequence's current kind of guess."""
        return self.odds[self.kind].wanted(room, bar, self.max_k, apart)

    def took(self, guessed: int, accepted: int) -> None:
        """``accepted`` of the ``guessed`` tokens agreed with the model."""
        self.guessed += guessed
        self.accepted += accepted
        self.odds[self.kind].took(guessed, accepted)
