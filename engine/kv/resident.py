"""What each free slot's cells still hold, and which free slot a prompt should take.

A slot keeps the cells of the last request it served, as llama-server's slots do: the next
grant goes to the free slot whose kept tokens start the most like the new prompt (token by
token, so any common start counts, not only whole blocks), and the cells after the common
start are dropped. A conversation's next turn thus finds its history where it left it.

Only slots that keep the running sequences' ids together are offered, though: llama.cpp
decodes in one pass only rows of consecutive sequence ids (``split_equal`` with a stream per
sequence), and each gap costs every step of every running sequence another pass over the
weights. A prompt whose history sits in a slot that would open a gap has it copied instead
(from the prefix cache, which holds what every slot keeps).
"""

from __future__ import annotations

from collections.abc import Sequence as Tokens


def common_start(a: Tokens[int], b: Tokens[int]) -> int:
    """How many tokens ``a`` and ``b`` share from their first."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:  # one C-level comparison for the common case of a whole match
        return n
    i = 0
    while a[i] == b[i]:
        i += 1
    return i


def runs(slots: set[int]) -> int:
    """How many runs of consecutive ids ``slots`` makes: llama.cpp's passes per step."""
    return sum(1 for slot in slots if slot - 1 not in slots)


class SlotPrefixes:
    """The tokens whose KV each slot's cells hold from position 0 while it is free."""

    def __init__(self, slots: int, min_reuse: int) -> None:
        self.tokens: list[list[int]] = [[] for _ in range(slots)]
        self.min_reuse = min_reuse
        self._kept_at = [0] * slots  # when each slot's tokens were kept: 0 for none
        self._clock = 0

    def offered(self, free: list[int]) -> list[int]:
        """The free slots that keep the running sequences' ids in the fewest runs."""
        taken = set(range(len(self.tokens))) - set(free)
        fewest = min(runs(taken | {slot}) for slot in free)
        return [slot for slot in free if runs(taken | {slot}) == fewest]

    def choose(self, prompt: Tokens[int], offered: list[int]) -> tuple[int, int]:
        """The slot for ``prompt`` among ``offered`` and how many of its kept tokens the
        prompt reuses: the one with the longest common start (short of the prompt's last
        token, whose logits are needed) if that is at least ``min_reuse`` tokens, else the
        one whose cells matter least (``spare``) with what it has."""
        head = prompt[:-1]
        shared = {slot: common_start(head, self.tokens[slot]) for slot in offered}
        best = max(offered, key=shared.__getitem__)  # the first (lowest) of equals
        pick = best if shared[best] >= self.min_reuse else self.spare(offered)
        return pick, shared[pick]

    def spare(self, offered: list[int]) -> int:
        """The slot to overwrite among ``offered``: one that keeps nothing, else the one
        kept longest ago (the lowest of equals)."""
        return min(offered, key=lambda slot: (self._kept_at[slot], slot))

    def take(self, slot: int) -> None:
        """``slot`` was granted: its cells are the request's now."""
        self.tokens[slot] = []
        self._kept_at[slot] = 0

    def keep(self, slot: int, tokens: list[int]) -> None:
        """``slot``'s request ended; its cells hold ``tokens`` (positions 0..len-1)."""
        self._clock += 1
        self.tokens[slot] = tokens
        self._kept_at[slot] = self._clock if tokens else 0
