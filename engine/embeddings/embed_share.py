"""How much embedding work a tick runs: the engine's time shared between embeddings and
generation, with a bound on what one tick's embedding part adds to a stream's pace.

An embedding part and the generation batch are two ``llama_decode`` calls in two contexts (an
embedding context pools; the slots' cells are not its), so they cannot share one batch. What
they share is the engine's time. While generation requests wait or run, a tick runs an
embedding part only while embeddings are owed time: each generation decode earns them
``share / (1 - share)`` of its duration, each part spends its own. A part holds at most
``tick_tokens`` tokens, so a stream's gap between two tokens grows by at most one such part,
and ``SPACING`` generation ticks without one follow each part, so at most one gap in three
carries one and a stream's median gap carries none, whatever the share and however long a
part takes against a decode (on a busy machine both stretch, not by the same factor). With
no generation request a part fills a whole embedding batch (``max_tokens``), and nothing is
owed or saved up across such spells, so an idle spell cannot be spent later as a burst.
"""

from __future__ import annotations

SPACING = 2  # generation ticks without an embedding part after each one


class EmbedShare:
    """The embedding part of each tick: how many tokens it may hold. Transport-free."""

    def __init__(self, share: float, tick_tokens: int, max_tokens: int) -> None:
        assert 0 < share <= 1 and tick_tokens > 0 and max_tokens > 0
        self.share = share
        self.tick_tokens = min(tick_tokens, max_tokens)
        self.max_tokens = max_tokens
        self.owed_ns = 0.0  # embedding time earned by generation's decodes, not yet spent
        self.since_part = SPACING  # generation ticks since the last part

    def room(self, generating: bool) -> int:
        """Tokens this tick's embedding part may hold (0: none this tick)."""
        if not generating:
            return self.max_tokens
        if self.share >= 1:
            return self.tick_tokens
        if self.since_part >= SPACING and self.owed_ns >= 0:
            return self.tick_tokens
        return 0

    def ran(self, generating: bool, generation_ns: int, embedding_ns: int) -> None:
        """What the tick's two decodes took, while embeddings waited."""
        if not generating or self.share >= 1:
            self.idle()
            return
        self.since_part = 0 if embedding_ns else self.since_part + 1
        earned = generation_ns * self.share / (1 - self.share)
        # what is earned and not spent this tick is not saved up beyond one tick's earning
        self.owed_ns = min(self.owed_ns + earned - embedding_ns, earned)

    def idle(self) -> None:
        """No embedding work waits: nothing is owed or saved up."""
        self.owed_ns = 0.0
        self.since_part = SPACING
