"""Logical KV block accountant, sharing-aware.

Blocks are ids ``0..total-1``; one block holds ``block_size`` tokens. The accountant is
logical only (llama.cpp owns the real cells). Every block is in exactly one state:

- free: refcount 0 and not cached; handed out by ``allocate``.
- used: refcount > 0 (a block shared by several requests counts once).
- cached: refcount 0 but held by the prefix cache; evictable.

so ``free + used + cached == total`` always. A block id out of range raises ``IndexError``.

Prefix-cache protocol: the cache marks a used block with ``set_cached(b, True)``; when its
last user releases it, it stays cached (evictable) instead of joining the free stack. A cache
hit ``acquire``s it (it is then used, not evictable); under memory pressure the caller
``evict``s the block the radix tree names (``RadixTree.lru_leaf(acc.refcount)``): the order of
eviction is the tree's, since only a leaf can go.
"""

from __future__ import annotations

class BlockAccountant:
    """Refcounts, a free stack and a count of evictable cached blocks; O(1) per block."""

    def __init__(self, total_blocks: int, block_size: int) -> None:
        """``total_blocks`` blocks of ``block_size`` tokens, all free. Both must be >= 1."""
    @property
    def total(self) -> int:
        """Number of blocks."""
    @property
    def block_size(self) -> int:
        """Tokens per block."""
    @property
    def free(self) -> int:
        """Blocks with refcount 0 that the prefix cache does not hold."""
    @property
    def used(self) -> int:
        """Blocks with refcount > 0; a shared block counts once."""
    @property
    def cached(self) -> int:
        """Blocks with refcount 0 held by the prefix cache: evictable."""
    @property
    def available(self) -> int:
        """``free + cached``: what an allocation can get, evicting if it must."""
    def blocks_for(self, n_tokens: int) -> int:
        """``ceil(n_tokens / block_size)``; 0 for 0; ``ValueError`` if negative."""
    def can_allocate(self, n: int) -> bool:
        """``0 <= n <= free``: ``allocate(n)`` would succeed without evicting."""
    def allocate(self, n: int) -> list[int]:
        """Take ``n`` free blocks with refcount 1 each.

        ``ValueError`` if ``n`` is negative or more than ``free``: the caller evicts first.
        """
    def acquire(self, block_id: int) -> None:
        """Add a reference to a used or cached block; a cached block is then used (pinned).

        ``ValueError`` on a free block (it holds no data; allocate it instead).
        """
    def release(self, block_id: int) -> None:
        """Drop a reference. At refcount 0 a cached block becomes evictable, any other block
        becomes free. ``ValueError`` if the refcount is already 0.
        """
    def release_all(self, ids: list[int]) -> None:
        """``release`` each id in order. Not atomic: on an invalid id it raises, and the ids
        before it stay released.
        """
    def set_cached(self, block_id: int, cached: bool) -> None:
        """The prefix cache holds a block (``True``) or lets it go (``False``).

        Idempotent. Uncaching a refcount-0 block frees it. Caching a free block is a
        ``ValueError``: only a block in use holds KV data worth caching.
        """
    def evict(self, block_id: int) -> None:
        """Free an evictable block (cached, refcount 0); ``ValueError`` otherwise."""
    def refcount(self, block_id: int) -> int:
        """References held on a block."""
    def is_cached(self, block_id: int) -> bool:
        """Whether the prefix cache holds a block (whatever its refcount)."""
