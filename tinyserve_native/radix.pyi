"""Block-aligned token radix tree for the prefix cache.

Each node is one full block of ``block_size`` token ids under its parent (the root is the
empty prefix). A node names the kv_blocks id that accounts for that block and the llama.cpp
sequence (its ``owner``) whose KV cells hold it. When the sequence passed to ``insert``
holds the whole path from position 0 (a finished request's own sequence), the deepest node
of a match names one sequence to copy the entire matched prefix from (``Match.seq_id``);
a caller that parks only the new blocks in a cache sequence instead copies each run of
blocks from its ``owner``. Both work with the ranges ``remove_leaf`` returns.

Invariant, enforced by ``insert``: the nodes a sequence owns lie on one root path (a
sequence's cells hold one token sequence). Hence a leaf is always the deepest node of its
sequence, and removing it frees a tail of that sequence's cells.

Intended protocol with ``kv_blocks.BlockAccountant`` (``acc``) and llama.cpp:

- hit: ``m = tree.match(prompt[:-1])`` (keep one token to compute logits from);
  ``acc.acquire(b)`` for each of ``m.block_ids``; ``llama_memory_seq_cp(m.seq_id, seq, 0,
  m.n_tokens)``; prefill the rest in ``seq``.
- done: ``held = tree.insert(tokens[:full], my_blocks[:n_full], seq)``; ``acc.set_cached(b,
  True)`` for each of ``held``; trim ``seq`` to ``full`` tokens; ``acc.release_all(my_blocks)``
  (a block of ours the tree did not take is then simply free).
- evict: ``b = tree.lru_leaf(acc.refcount)`` (-1: nothing is evictable); ``seq, p0, p1 =
  tree.remove_leaf(b)``; ``llama_memory_seq_rm(seq, p0, p1)``; ``acc.evict(b)``. A
  sequence that leaves ``seqs_in_use()`` can be cleared and reused.

The eviction order lives here, not in the accountant: only a leaf can go (its cells are the
tail of its sequence's), and an inner node becomes a leaf when its last child goes, at the
place its last use gives it. The leaves sit in a heap keyed by last use (``match`` and
``insert`` stamp the whole path); pinned leaves are skipped, not tracked, since the tree is
not told of refcount changes.

The tree counts one block per node. A sequence that computed its own copy of a block the
tree already had (rather than sharing it by ``seq_cp``) keeps those cells until its last
node goes, and ``remove_leaf`` then frees them (see its ranges).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

class Match(NamedTuple):
    """The longest cached full-block prefix of a token list."""

    n_tokens: int  # a multiple of block_size; 0 when nothing matched
    block_ids: list[int]  # one per matched block, root first
    seq_id: int  # sequence holding the whole matched prefix; -1 when nothing matched

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
        """The longest start of ``tokens`` that a block cached directly below ``parent_block``
        (-1: the root) begins with, fewer than ``block_size`` tokens, and the sequence holding
        that block's cells: ``(n_tokens, seq_id)``, ``(0, -1)`` when no child shares the first
        token. Of children sharing as many, the most recently used. Marks nothing as used.
        ``KeyError`` for a ``parent_block`` not in the tree.

        For reusing part of the block after a full-block match: ``llama_memory_seq_cp(seq_id,
        seq, start, start + n_tokens)`` where ``start`` is the match's length.
        """
    def insert(self, tokens: list[int], block_ids: list[int], seq_id: int) -> list[int]:
        """Cache ``tokens``, whose KV cells ``seq_id`` holds from position 0.

        ``len(tokens)`` must be a multiple of ``block_size``, with one block id per block.
        Blocks already in the tree keep their node (old block id and sequence); the rest
        become new nodes owned by ``seq_id``. Returns the block ids the tree now references
        for the whole path, root first: where it differs from ``block_ids``, the caller's
        block is a duplicate to release. Marks the path as just used.

        ``ValueError``, changing nothing, if the lengths disagree, ``seq_id < 0``, a block id
        for a new node repeats or is already in the tree, or ``seq_id`` already owns nodes
        off this path (its cells cannot hold two token sequences).
        """
    def extend(
        self, parent_block: int, tokens: list[int], block_ids: list[int], seq_id: int
    ) -> list[int]:
        """``insert`` of the blocks that follow the node holding ``parent_block`` (-1: the
        root), without walking the tree down to it: ``tokens`` and ``block_ids`` are those
        blocks only, and ``seq_id`` must hold the whole path from position 0 as for
        ``insert``. Returns the tree's block ids for those blocks; marks the whole path from
        the root as just used. ``KeyError`` if no node holds ``parent_block``; otherwise the
        errors of ``insert``, changing nothing.
        """
    def remove_leaf(self, block_id: int) -> tuple[int, int, int]:
        """Drop the leaf holding ``block_id``; returns ``(seq_id, start_pos, end_pos)``, the
        cells to free with ``llama_memory_seq_rm(seq_id, start_pos, end_pos)``.

        ``end_pos`` is the end of the leaf's block. ``start_pos`` is the end of the deepest
        node ``seq_id`` still owns (0 if none), so the range also covers cells the sequence
        held for blocks that other sequences own. ``KeyError`` if no node holds the id,
        ``ValueError`` if the node has children.
        """
    def is_leaf(self, block_id: int) -> bool:
        """Whether the node holding ``block_id`` has no children; ``KeyError`` if none does."""
    def owner(self, block_id: int) -> int:
        """The sequence whose cells hold the node's block; ``KeyError`` if no node holds it."""
    def path_tokens(self, block_id: int) -> list[int]:
        """The tokens from the root through the node's block, a multiple of ``block_size``
        long; ``KeyError`` if no node holds it.
        """
    def lru_leaf(self, refcount: Callable[[int], int]) -> int:
        """The leaf least recently used (by ``match``/``insert``/``extend``) among those whose
        block has ``refcount(block) == 0``; -1 if there is none. Changes nothing.

        O(log n) amortised, plus O(log n) for each pinned leaf used less recently than the
        answer (at most one per request holding a hit).
        """
    def seqs_in_use(self) -> set[int]:
        """Sequences that still own at least one node."""
