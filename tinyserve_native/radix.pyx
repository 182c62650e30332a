"""Block-aligned token radix tree: cached prefixes and the ids their blocks' KV is kept under.

A node is one full block of ``block_size`` token ids under its parent, naming the id the
caller keeps that block's KV under (``engine/kv/host_cache.py``: a row of its host arena).
"""

from heapq import heapify, heappop, heappush
from typing import NamedTuple

Match = NamedTuple("Match", [("n_tokens", int), ("block_ids", list)])
Match.__doc__ = "The longest cached full-block prefix of a token list."
# NOTE: the functional form guesses the module from the caller's frame, which a compiled
# module lacks; set it so the tuples pickle.
Match.__module__ = __name__


cdef class _Node:
    def __cinit__(self):
        self.children = {}
        self.block_id = -1
        self.depth = -1


cdef _Node _new_node(_Node parent, tuple key, long long block_id):
    cdef _Node node = _Node()
    node.parent = parent
    node.key = key
    node.block_id = block_id
    node.depth = parent.depth + 1
    parent.children[key] = node
    return node


cdef class RadixTree:
    """Prefix cache index over full blocks; see radix.pyi for the protocol."""

    def __cinit__(self, Py_ssize_t block_size):
        if block_size <= 0:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self._block_size = block_size
        self._root = _Node()
        self._by_block = {}
        self._clock = 0
        self._leaf_heap = []

    @property
    def block_size(self) -> int:
        return self._block_size

    @property
    def n_nodes(self) -> int:
        return len(self._by_block)

    def __contains__(self, block_id: object) -> bool:
        return block_id in self._by_block

    def match(self, list tokens not None):
        """Longest cached full-block prefix of ``tokens``; marks its path recently used."""
        cdef list path = self._walk(self._root, tokens)
        if not path:
            return Match(0, [])
        self._touch(<_Node>path[len(path) - 1])
        return Match(len(path) * self._block_size, [(<_Node>n).block_id for n in path])

    def partial(self, long long parent_block, list tokens not None) -> tuple:
        """The most of ``tokens`` (fewer than a block) that a block cached directly below
        ``parent_block`` (-1: the root) starts with, and that block's id."""
        cdef _Node parent = self._root if parent_block == -1 else self._by_block[parent_block]
        cdef Py_ssize_t limit = min(len(tokens), self._block_size - 1)
        cdef Py_ssize_t best = 0, k
        cdef long long found = -1
        cdef unsigned long long best_used = 0
        cdef _Node child
        for value in parent.children.values():
            child = <_Node>value
            k = 0
            while k < limit and k < len(child.key) and child.key[k] == tokens[k]:
                k += 1
            if k > best or (k == best and k > 0 and child.last_used > best_used):
                best, found, best_used = k, child.block_id, child.last_used
        return best, found

    def insert(self, list tokens not None, list block_ids not None) -> list:
        """Cache ``tokens`` (whole blocks); returns the tree's block ids for the path."""
        return self._insert_below(self._root, tokens, block_ids)

    def extend(self, long long parent_block, list tokens not None, list block_ids not None) -> list:
        """``insert`` of the blocks that follow the node of ``parent_block`` (-1: the root),
        without walking down to it; returns the tree's block ids for those blocks."""
        cdef _Node start = self._below(parent_block)
        return self._insert_below(start, tokens, block_ids)

    cdef _Node _below(self, long long parent_block):
        """The node to hang blocks from; a tail has nothing below it."""
        if parent_block == -1:
            return self._root
        cdef _Node parent = self._by_block[parent_block]
        if len(parent.key) < self._block_size:
            raise ValueError(f"block {parent_block} is a tail: nothing hangs from it")
        return parent

    def add_tail(self, long long parent_block, list tokens not None, long long block_id) -> int:
        """Cache a partial block (1 to block_size - 1 tokens) below the node of
        ``parent_block`` (-1: the root), as a leaf; returns the tree's id for it."""
        cdef _Node parent = self._below(parent_block)
        if not 0 < len(tokens) < self._block_size:
            raise ValueError(f"a tail of {len(tokens)} tokens: 1 to {self._block_size - 1}")
        cdef tuple key = tuple(tokens)
        existing = parent.children.get(key)
        if existing is None:
            self._check_insertable([block_id])
            existing = _new_node(parent, key, block_id)
            self._by_block[block_id] = existing
        self._touch(<_Node>existing)
        return (<_Node>existing).block_id

    cdef list _insert_below(self, _Node start, list tokens, list block_ids):
        cdef Py_ssize_t bs = self._block_size
        cdef Py_ssize_t n_blocks = len(tokens) // bs
        if len(tokens) % bs:
            raise ValueError(f"{len(tokens)} tokens is not a whole number of {bs}-token blocks")
        if len(block_ids) != n_blocks:
            raise ValueError(f"{n_blocks} blocks of tokens but {len(block_ids)} block ids")
        cdef list path = self._walk(start, tokens)
        self._check_insertable(block_ids[len(path):])
        cdef _Node node = path[len(path) - 1] if path else start
        cdef Py_ssize_t i
        for i in range(len(path), n_blocks):
            node = _new_node(node, tuple(tokens[i * bs:(i + 1) * bs]), block_ids[i])
            self._by_block[node.block_id] = node
            path.append(node)
        self._touch(node)
        return [(<_Node>n).block_id for n in path]

    cdef int _check_insertable(self, list new_ids) except -1:
        cdef long long checked
        for block_id in new_ids:
            checked = block_id  # TypeError/OverflowError now, not halfway through the insert
        if len(set(new_ids)) != len(new_ids):
            raise ValueError(f"block ids for new nodes repeat: {new_ids}")
        clashes = [b for b in new_ids if b in self._by_block]
        if clashes:
            raise ValueError(f"block ids {clashes} are already in the tree")
        return 0

    def remove_leaf(self, long long block_id) -> None:
        """Drop the leaf holding ``block_id``."""
        cdef _Node node = self._by_block[block_id]
        if node.children:
            raise ValueError(f"block {block_id} has {len(node.children)} children: not a leaf")
        cdef _Node parent = node.parent
        del parent.children[node.key]
        del self._by_block[block_id]
        if parent is not self._root and not parent.children:
            self._push_leaf(parent)  # its last child went: it is a leaf now
        node.parent = None

    def is_leaf(self, long long block_id) -> bool:
        """Whether the node for ``block_id`` has no children (``KeyError`` if absent)."""
        return not (<_Node>self._by_block[block_id]).children

    def last_used(self, long long block_id) -> int:
        """When the node was last used: a stamp that only grows (``KeyError`` if absent)."""
        return (<_Node>self._by_block[block_id]).last_used

    def depth(self, long long block_id) -> int:
        """Blocks above the node's (``KeyError`` if absent): its tokens start at
        ``depth * block_size``."""
        return (<_Node>self._by_block[block_id]).depth

    def path_tokens(self, long long block_id) -> list:
        """The tokens from the root through the node's block (``KeyError`` if absent)."""
        cdef _Node node = self._by_block[block_id]
        cdef list keys = []
        while node is not self._root:
            keys.append(node.key)
            node = node.parent
        return [token for key in reversed(keys) for token in key]

    def lru_leaf(self, refcount not None) -> int:
        """The least recently used leaf whose block has ``refcount(block) == 0``; -1 if none."""
        cdef list heap = self._leaf_heap
        cdef list pinned = []
        cdef long long found = -1
        try:
            while heap:
                entry = heap[0]
                if not self._is_current_leaf(entry):
                    heappop(heap)
                elif refcount(entry[1]) == 0:
                    found = entry[1]
                    break
                else:
                    pinned.append(heappop(heap))
        finally:  # a refcount that raises must not lose the pinned leaves
            for entry in pinned:
                heappush(heap, entry)
        return found

    def __repr__(self) -> str:
        return f"RadixTree(block_size={self._block_size}, n_nodes={len(self._by_block)})"

    cdef list _walk(self, _Node start, list tokens):
        cdef list path = []
        cdef _Node node = start
        cdef Py_ssize_t bs = self._block_size
        cdef Py_ssize_t i
        for i in range(len(tokens) // bs):
            child = node.children.get(tuple(tokens[i * bs:(i + 1) * bs]))
            if child is None:
                break
            node = <_Node>child
            path.append(node)
        return path

    cdef int _touch(self, _Node deepest) except -1:
        # One tick per operation: leaves never share one (no leaf is on another's path), and a
        # node is never older than anything below it.
        self._clock += 1
        cdef _Node node = deepest
        while node is not self._root:
            node.last_used = self._clock
            node = node.parent
        if deepest is not self._root and not deepest.children:
            self._push_leaf(deepest)
        return 0

    cdef int _push_leaf(self, _Node node) except -1:
        heappush(self._leaf_heap, (node.last_used, node.block_id))
        # Each touch of a leaf leaves a stale entry behind: rebuild before they outnumber
        # the nodes, so the heap stays O(nodes) and pushes O(log n) amortised.
        if len(self._leaf_heap) > 2 * len(self._by_block) + 16:
            self._leaf_heap = [
                ((<_Node>n).last_used, (<_Node>n).block_id)
                for n in self._by_block.values() if not (<_Node>n).children
            ]
            heapify(self._leaf_heap)
        return 0

    cdef bint _is_current_leaf(self, tuple entry):
        node = self._by_block.get(entry[1])
        return (
            node is not None and not (<_Node>node).children
            and (<_Node>node).last_used == entry[0]
        )
