"""How much embedding work a tick runs: the engine's time shared between embeddings and
generation, with a bound on what one tick's embedding part adds to a stream's pace.

An embedding part and the generation batch are two ``llama_decode`` calls in two contexts (an
embedding context pools; the slots' cells are not its), so they cannot share one batch. What
they share is the engine's time. While generation requests wait or run, a tick runs an
embedding part only while embeddings are owed time: each generation decode earns them
``share / (1 - share)`` of its duration, each part spends its own. ``SPACING`` generation
ticks without a part follow each part, so at most one gap in three carries one and a
stream's median gap carries none.

A part is bounded in time, not only in tokens: it holds as many tokens as take about
``part_decodes`` generation decodes, both costs measured as the engine goes (a moving
average of a generation decode, and of an embedding token in the parts run beside one), and
never more than ``tick_tokens`` nor fewer than ``MIN_PART``. A stream's gap with a part in it
is then about ``1 + part_decodes`` of its plain gap whatever the machine: a fixed count of
tokens is a small part on a fast machine and several decodes' time on a slow one (24 tokens
were ten decodes on a two-core box). With no generation request a part fills a whole
embedding batch (``max_tokens``), and nothing is owed or saved up across such spells, so an
idle spell cannot be spent later as a burst.
"""

from __future__ import annotations

SPACING = 2  # generation ticks without an embedding part after each one
MIN_PART = 4  # tokens: fewer would spend a decode call's fixed cost on little work
SMOOTHING = 0.25  # weight of the newest measurement in the moving averages


class EmbedShare:
    """The embedding part of each tick: how many tokens it may hold. Transport-free."""

    def __init__(
        self, share: float, tick_tokens: int, max_tokens: int, part_decodes: float = 3.0
    ) -> None:
        assert 0 < share <= 1 and tick_tokens > 0 and max_tokens > 0 and part_decodes > 0
        self.share = share
        self.tick_tokens = min(tick_tokens, max_tokens)
        self.min_part = min(MIN_PART, self.tick_tokens)  # the first part's, and the floor
        self.max_tokens = max_tokens
        self.part_decodes = part_decodes
        self.owed_ns = 0.0  # embedding time earned by generation's decodes, not yet spent
        self.since_part = SPACING  # generation ticks since the last part
        self.decode_ns = 0.0  # a generation decode's time, averaged (0: none seen yet)
        self.token_ns = 0.0  # an embedding token's time in a part beside generation, likewise

    def room(self, generating: bool) -> int:
        """Tokens this tick's embedding part may hold (0: none this tick)."""
        if not generating:
            return self.max_tokens
        if self.share >= 1 or (self.since_part >= SPACING and self.owed_ns >= 0):
            return self.part_tokens()
        return 0

    def part_tokens(self) -> int:
        """The tokens of a part beside generation: about ``part_decodes`` decodes' time."""
        if not (self.decode_ns and self.token_ns):  # unmeasured: the smallest part
            return self.min_part
        fits = int(self.part_decodes * self.decode_ns / self.token_ns)
        return max(self.min_part, min(fits, self.tick_tokens))

    def ran(
        self, generating: bool, generation_ns: int, embedding_ns: int, embedding_tokens: int
    ) -> None:
        """What the tick's two decodes took (and the part's tokens), while embeddings waited."""
        if generating:
            self._measured(generation_ns, embedding_ns, embedding_tokens)
        if not generating or self.share >= 1:
            self.idle()
            return
        self.since_part = 0 if embedding_ns else self.since_part + 1
        earned = generation_ns * self.share / (1 - self.share)
        # what is earned and not spent this tick is not saved up beyond one tick's earning
        self.owed_ns = min(self.owed_ns + earned - embedding_ns, earned)

    def _measured(self, generation_ns: int, embedding_ns: int, embedding_tokens: int) -> None:
        if generation_ns:
            self.decode_ns = _averaged(self.decode_ns, generation_ns)
        if embedding_ns and embedding_tokens:
            self.token_ns = _averaged(self.token_ns, embedding_ns / embedding_tokens)

    def idle(self) -> None:
        """No embedding work waits, or none beside generation: nothing is owed or saved up."""
        self.owed_ns = 0.0
        self.since_part = SPACING


def _averaged(average: float, sample: float) -> float:
    return sample if not average else average + SMOOTHING * (sample - average)
