"""Cost of evicting cached blocks from the prefix cache's radix tree.

A tree of ``n`` cached leaves (one block each, every one unreferenced) and an accountant that
holds them; then ``k`` evictions, least recently used first, as ``HostCache`` makes them: pick
the victim, ``remove_leaf``, ``evict``. Prints µs per eviction for each n. Picks victims with
the tree's ``lru_leaf`` (one eviction order, a heap), or with ``leaves_lru`` (every leaf sorted
per eviction) on a build from before issue 12; builds from before issue 32 took a cache
sequence in ``insert`` and need the script as it was then.

    .venv/bin/python bench/eviction.py
"""

from __future__ import annotations

import argparse
import time

from tinyserve_native.kv_blocks import BlockAccountant
from tinyserve_native.radix import RadixTree

BLOCK = 16


def build(n: int) -> tuple[RadixTree, BlockAccountant]:
    tree, blocks = RadixTree(BLOCK), BlockAccountant(n, BLOCK)
    for i in range(n):
        [block] = blocks.allocate(1)
        tree.insert([i] * BLOCK, [block])
        blocks.set_cached(block, True)
        blocks.release(block)
    return tree, blocks


def victim(tree: RadixTree, blocks: BlockAccountant) -> int:
    if hasattr(tree, "lru_leaf"):
        return int(tree.lru_leaf(blocks.refcount))
    return next(b for b in tree.leaves_lru() if blocks.refcount(b) == 0)  # before issue 12


def evict(tree: RadixTree, blocks: BlockAccountant, k: int) -> float:
    """Seconds to evict ``k`` blocks."""
    start = time.perf_counter()
    for _ in range(k):
        block = victim(tree, blocks)
        tree.remove_leaf(block)
        blocks.evict(block)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=[100, 1000, 10000])
    parser.add_argument("--k", type=int, default=64)
    args = parser.parse_args()
    for n in args.n:
        tree, blocks = build(n)
        seconds = evict(tree, blocks, min(args.k, n))
        print(f"n={n:6d} leaves  k={args.k}  {seconds / args.k * 1e6:10.1f} us per eviction")


if __name__ == "__main__":
    main()
