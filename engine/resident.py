"""What each free slot's cells still hold, and which free slot a prompt should take.

A slot keeps the cells of the last request it served, as llama-server's slots do: the next
grant goes to the free slot whose kept tokens start the most like the new prompt (token by
token, so any common start counts, not only whole blocks), and the cells after the common
start are dropped. A conversation's next turn thus finds its history where it left it.
"""

from __future__ import annotations

from collections.abc import Sequence as Tokens


def common_start(a: Tokens[int], b: Tokens[int]) -> int:
    """How many tokens ``a`` and ``b`` share from their first."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:  # NOTE: one C-level comparison for the common case of a whole match
        return n
    i = 0
    while a[i] == b[i]:
        i += 1
    return i


class SlotPrefixes:
    """The tokens whose KV each slot's cells hold from position 0 while it is free."""

    def __init__(self, slots: int, min_reuse: int) -> None:
        self.tokens: list[list[int]] = [[] for _ in range(slots)]
        self.min_reuse = min_reuse

    def choose(self, prompt: Tokens[int], free: list[int]) -> tuple[int, int]:
        """The free slot for ``prompt`` and how many of its kept tokens the prompt reuses:
        the slot with the longest common start (short of the prompt's last token, whose
        logits are needed) if that is at least ``min_reuse`` tokens, else the lowest free
        slot with what it has. Low slots first keep the running sequences' ids together,
        which is what lets llama.cpp decode them in one pass."""
        head = prompt[:-1]
        shared = [common_start(head, self.tokens[slot]) for slot in free]
        best = max(range(len(free)), key=shared.__getitem__)  # the first (lowest) of equals
        pick = best if shared[best] >= self.min_reuse else 0
        return free[pick], shared[pick]

    def take(self, slot: int, tokens: int) -> None:
        """``slot`` was granted, keeping its first ``tokens``: its cells are the request's."""
        self.tokens[slot] = []

    def keep(self, slot: int, tokens: list[int]) -> None:
        """``slot``'s request ended; its cells hold ``tokens`` (positions 0..len-1)."""
        self.tokens[slot] = tokens
