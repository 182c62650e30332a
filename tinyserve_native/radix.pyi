"""Block-aligned token radix tree for the prefix cache.

Each node is one full block of ``block_size`` token ids under its parent (the root is the
empty prefix) and names the id its KV is kept under (``engine/kv/host_cache.py``: a row of the
host arena, accounted by ``kv_blocks.BlockAccountant``). A block's KV depends on every token
before it, so a block is only ever found below the prefix it was computed after.

Intended protocol with a ``kv_blocks.BlockAccountant`` (``acc``) over the stored blocks:

- store: ``known = tree.match(tokens)``; ``new = acc.allocate(n)``; copy the new blocks'
  KV in; ``tree.extend(known.block_ids[-1] or -1, new_tokens, new)``; ``acc.set_cached(b,
  True)`` then ``acc.release(b)`` for each: cached, evictable.
- hit: ``m = tree.match(prompt[:-1])`` (keep one token to compute logits from);
  ``acc.acquire(b)`` for each of ``m.block_ids`` while their KV is read; release after.
- evict: ``b = tree.lru_leaf(acc.refcount)`` (-1: nothing is evictable);
  ``tree.remove_leaf(b)``; ``acc.evict(b)``.

The eviction order lives here, not in the accountant: only a leaf can go (a block is useless
without the prefix above it), and an inner node becomes a leaf when its last child goes, at
the place its last use gives it. The leaves sit in a heap keyed by last use (``match``,
``insert`` and ``extend`` stamp the whole path); pinned leaves are skipped, not tracked, since
the tree is not told of refcount changes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

class Match(NamedTuple):
    """The longest cached full-block prefix of a token list."""

    n_tokens: int  # a multiple of block_size; 0 when nothing matched
    block_ids: list[int]  # one per matched block, root first

class RadixTree:
    """Prefix cache index over full blocks."""

    def __init__(self, block_size: int) -> None:
        """An empty tree; ``ValueError`` unless ``block_size >= 1``."""
    @property
    def block_size(self) -> int:
        """Tokens per node."""
    @property
    def n_nodes(self) -> int:
        """Nodes (cached blocks) in the tree."""
    def __contains__(self, block_id: object, /) -> bool:
        """Whether a node holds ``block_id``."""
    def match(self, tokens: list[int]) -> Match:
        """Longest cached prefix of ``tokens`` in whole blocks (a trailing partial block is
        ignored); marks every node on it as just used.
        """
    def partial(self, parent_block: int, tokens: list[int]) -> tuple[int, int]:
        """The longest start of ``tokens`` that a block or tail cached directly below
        ``parent_block`` (-1: the root) begins with, fewer than ``block_size`` tokens, and its id:
        ``(n_tokens, block_id)``, ``(0, -1)`` when no child shares the first token. Of
        children sharing as many, the most recently used. Marks nothing as used. ``KeyError``
        for a ``parent_block`` not in the tree.
        """
    def insert(self, tokens: list[int], block_ids: list[int]) -> list[int]:
        """Cache ``tokens``: ``len(tokens)`` a multiple of ``block_size``, one block id per
        block. Blocks already in the tree keep their node (and id); the rest become new
        nodes. Returns the block ids the tree now holds for the whole path, root first:
        where it differs from ``block_ids``, the caller's block is a duplicate. Marks the
        path as just used.

        ``ValueError``, changing nothing, if the lengths disagree or a block id for a new
        node repeats or is already in the tree.
        """
    def extend(self, parent_block: int, tokens: list[int], block_ids: list[int]) -> list[int]:
        """``insert`` of the blocks that follow the node holding ``parent_block`` (-1: the
        root), without walking the tree down to it: ``tokens`` and ``block_ids`` are those
        blocks only. Returns the tree's block ids for those blocks; marks the whole path
        from the root as just used. ``KeyError`` if no node holds ``parent_block``;
        otherwise the errors of ``insert``, changing nothing.
        """
    def add_tail(self, parent_block: int, tokens: list[int], block_id: int) -> int:
        """Cache a tail: a partial block of 1 to ``block_size - 1`` tokens below the node
        holding ``parent_block`` (-1: the root), a leaf nothing can hang from. ``match`` never
        walks into one (it takes whole blocks); ``partial`` finds it like any child. Returns
        the tree's id for it (an identical tail already there keeps its id); marks its path
        as just used. ``KeyError`` if no node holds ``parent_block``; ``ValueError`` for a
        length outside that range, or an id already in the tree for a new tail.
        """
    def remove_leaf(self, block_id: int) -> None:
        """Drop the leaf holding ``block_id``. ``KeyError`` if no node holds the id,
        ``ValueError`` if the node has children.
        """
    def is_leaf(self, block_id: int) -> bool:
        """Whether the node holding ``block_id`` has no children; ``KeyError`` if none does."""
    def last_used(self, block_id: int) -> int:
        """When the node holding ``block_id`` was last used (by ``match``, ``insert``,
        ``extend``, ``add_tail``): a stamp that only grows; a node is never older than one
        below it. ``KeyError`` if no node holds the id."""
    def depth(self, block_id: int) -> int:
        """Blocks above the node's: its tokens start at ``depth * block_size``; ``KeyError``
        if no node holds the id."""
    def path_tokens(self, block_id: int) -> list[int]:
        """The tokens from the root through the node's block (or tail); ``KeyError`` if no
        node holds it.
        """
    def lru_leaf(self, refcount: Callable[[int], int]) -> int:
        """The leaf least recently used (by ``match``/``insert``/``extend``) among those whose
        block has ``refcount(block) == 0``; -1 if there is none. Changes nothing.

        O(log n) amortised, plus O(log n) for each pinned leaf used less recently than the
        answer.
        """
