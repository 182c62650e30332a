"""Prompt-lookup speculation: a greedy sequence's next tokens guessed from its own text.

A sequence whose last few tokens (an n-gram, ``NGRAM_MAX`` down to ``NGRAM_MIN`` long) occurred
earlier in its prompt or output guesses that what followed them then follows now (vLLM's
``ngram`` speculator, llama.cpp's lookup decoding). The guesses ride as extra rows of the
sequence in the tick's one ``llama_decode``; the runner checks them against the model's own
picks, and the longest agreeing run is taken, so a greedy reply is the same token for token
with speculation on or off. Sampled requests are not speculated on: their distribution stays
what their sampler chain gives, with no rule needed to keep it.

Never slower: each sequence's guess length adapts to how its guesses fare. It doubles (up to
``--speculate-tokens``) while they are taken whole and halves when none is; at zero the
sequence stops guessing for ``COOLDOWN_TICKS`` ticks, then tries one token again. The
scheduler gives guesses only the step's token budget left after every decode row and prefill
chunk, so they never take a prompt's place in the batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

NGRAM_MAX = 3
NGRAM_MIN = 2
COOLDOWN_TICKS = 16


class Lookup:
    """Where each n-gram of a token list last occurred, for ``NGRAM_MIN`` to ``NGRAM_MAX``:
    the position of the token that followed it."""

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self._next: dict[tuple[int, ...], int] = {}

    def extend(self, tokens: list[int]) -> None:
        for token in tokens:
            self._append(token)

    def _append(self, token: int) -> None:
        # Index the n-grams that end just before ``token``: each now has a follower.
        tokens, end = self.tokens, len(self.tokens)
        for n in range(NGRAM_MIN, NGRAM_MAX + 1):
            if end >= n:
                self._next[tuple(tokens[end - n : end])] = end
        tokens.append(token)

    def guess(self, k: int) -> list[int]:
        """``k`` tokens that followed the longest n-gram the list ends with, the last time it
        occurred before (none when it never did). A continuation that reaches the end of the
        list goes on into the guess itself: text that repeats with a period repeats on."""
        tokens, end = self.tokens, len(self.tokens)
        for n in range(NGRAM_MAX, NGRAM_MIN - 1, -1):
            if end < n:
                continue
            start = self._next.get(tuple(tokens[end - n : end]))
            if start is not None:
                guess = tokens[start : start + k]
                while len(guess) < k:
                    guess.append(guess[len(guess) - (end - start)])
                return guess
        return []


@dataclass
class Speculation:
    """One sequence's guessing: its lookup, and how many tokens it guesses now."""

    max_k: int
    k: int = 0
    cooldown: int = 0  # ticks to go without guessing
    lookup: Lookup = field(default_factory=Lookup)
    guessed: int = 0  # totals, for the timeline
    accepted: int = 0

    def __post_init__(self) -> None:
        self.k = self.max_k

    def guess(self, room: int) -> list[int]:
        """This tick's guess, at most ``room`` tokens (none while cooling down)."""
        if self.cooldown:
            self.cooldown -= 1
            if self.cooldown == 0:
                self.k = 1
            return []
        return self.lookup.guess(min(self.k, room)) if room > 0 else []

    def took(self, guessed: int, accepted: int) -> None:
        """``accepted`` of the ``guessed`` tokens agreed with the model."""
        self.guessed += guessed
        self.accepted += accepted
        if accepted == guessed:
            self.k = min(self.k * 2, self.max_k)
        elif accepted == 0:
            self.k //= 2
            if self.k == 0:
                self.cooldown = COOLDOWN_TICKS
