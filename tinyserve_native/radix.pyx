"""Block-aligned token radix tree: cached prefixes, their KV blocks and llama.cpp sequences.

A node is one full block of ``block_size`` token ids under its parent. It names the
kv_blocks id accounting for that block and the llama.cpp sequence whose cells hold it.
"""

from heapq import heapify, heappop, heappush
from typing import NamedTuple

Match = NamedTuple("Match", [("n_tokens", int), ("block_ids", list), ("seq_id", int)])
Match.__doc__ = "The longest cached full-block prefix of a token list."
# NOTE: the functional form guesses the module from the caller's frame, which a compiled
# module lacks; set it so the tuples pickle.
Match.__module__ = __name__


cdef class _Node:
    def __cinit__(self):
        self.children = {}
        self.block_id = -1
        self.seq_id = -1
        self.depth = -1


cdef _Node _new_node(_Node parent, tuple key, long long block_id, long long seq_id):
    cdef _Node node = _Node()
    node.parent = parent
    node.key = key
    node.block_id = block_id
    node.seq_id = seq_id
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
        self._seq_tip = {}
        self._seq_count = {}
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
            return Match(0, [], -1)
        cdef _Node deepest = path[len(path) - 1]
        self._touch(deepest)
        return Match(
            len(path) * self._block_size, [(<_Node>n).block_id for n in path], deepest.seq_id
        )

    def partial(self, long long parent_block, list tokens not None) -> tuple:
        """The most of ``tokens`` (fewer than a block) that a block cached directly below
        ``parent_block`` (-1: the root) starts with, and the sequence holding it."""
        cdef _Node parent = self._root if parent_block == -1 else self._by_block[parent_block]
        cdef Py_ssize_t limit = min(len(tokens), self._block_size - 1)
        cdef Py_ssize_t best = 0, k
        cdef long long owner = -1
        cdef unsigned long long best_used = 0
        cdef _Node child
        for value in parent.children.values():
            child = <_Node>value
            k = 0
            while k < limit and child.key[k] == tokens[k]:
                k += 1
            if k > best or (k == best and k > 0 and child.last_used > best_used):
                best, owner, best_used = k, child.seq_id, child.last_used
        return best, owner

    def insert(self, list tokens not None, list block_ids not None, long long seq_id) -> list:
        """Cache ``tokens`` (whole blocks) held by ``seq_id``; returns the tree's block ids."""
        return self._insert_below(self._root, tokens, block_ids, seq_id)

    def extend(
        self, long long parent_block, list tokens not None, list block_ids not None,
        long long seq_id,
    ) -> list:
        """``insert`` of the blocks that follow the node of ``parent_block`` (-1: the root),
        without walking down to it; returns the tree's block ids for those blocks."""
        cdef _Node start = self._root if parent_block == -1 else self._by_block[parent_block]
        return self._insert_below(start, tokens, block_ids, seq_id)

    cdef list _insert_below(self, _Node start, list tokens, list block_ids, long long seq_id):
        cdef Py_ssize_t bs = self._block_size
        cdef Py_ssize_t n_blocks = len(tokens) // bs
        if len(tokens) % bs:
            raise ValueError(f"{len(tokens)} tokens is not a whole number of {bs}-token blocks")
        if len(block_ids) != n_blocks:
            raise ValueError(f"{n_blocks} blocks of tokens but {len(block_ids)} block ids")
        if seq_id < 0:
            raise ValueError(f"seq_id must be >= 0, got {seq_id}")
        cdef list path = self._walk(start, tokens)
        cdef list new_ids = block_ids[len(path):]
        cdef _Node node = path[len(path) - 1] if path else start
        self._check_insertable(node, new_ids, seq_id)
        cdef Py_ssize_t i
        for i in range(len(path), n_blocks):
            node = _new_node(node, tuple(tokens[i * bs:(i + 1) * bs]), block_ids[i], seq_id)
            self._by_block[node.block_id] = node
            path.append(node)
        if new_ids:
            self._seq_tip[seq_id] = node
            self._seq_count[seq_id] = self._seq_count.get(seq_id, 0) + len(new_ids)
        self._touch(node)
        return [(<_Node>n).block_id for n in path]

    cdef int _check_insertable(self, _Node deepest, list new_ids, long long seq_id) except -1:
        if not new_ids:
            return 0
        cdef long long checked
        for block_id in new_ids:
            checked = block_id  # TypeError/OverflowError now, not halfway through the insert
        if len(set(new_ids)) != len(new_ids):
            raise ValueError(f"block ids for new nodes repeat: {new_ids}")
        clashes = [b for b in new_ids if b in self._by_block]
        if clashes:
            raise ValueError(f"block ids {clashes} are already in the tree")
        tip = self._seq_tip.get(seq_id)
        # NOTE: a sequence holds one token path. If seq_id already owns nodes off this path,
        # its cells cannot hold both: the caller reused a sequence the tree still relies on.
        if tip is not None and not _is_on_path(<_Node>tip, deepest):
            raise ValueError(f"sequence {seq_id} already holds a different cached prefix")
        return 0

    def remove_leaf(self, long long block_id) -> tuple:
        """Drop a leaf; returns ``(seq_id, start_pos, end_pos)`` of the cells to free."""
        cdef _Node node = self._by_block[block_id]
        if node.children:
            raise ValueError(f"block {block_id} has {len(node.children)} children: not a leaf")
        cdef long long seq = node.seq_id
        # NOTE: a leaf is always its sequence's tip: a sequence owns nodes on one root path
        # only (insert enforces it), and a leaf has nothing below it.
        assert self._seq_tip[seq] is node
        cdef _Node parent = node.parent
        del parent.children[node.key]
        del self._by_block[block_id]
        if parent is not self._root and not parent.children:
            self._push_leaf(parent)  # its last child went: it is a leaf now
        cdef _Node tip = self._owned_ancestor(node)
        cdef Py_ssize_t start = 0
        if tip is None:
            del self._seq_tip[seq]
            del self._seq_count[seq]
        else:
            self._seq_tip[seq] = tip
            self._seq_count[seq] -= 1
            start = (tip.depth + 1) * self._block_size
        node.parent = None
        return seq, start, (node.depth + 1) * self._block_size

    def is_leaf(self, long long block_id) -> bool:
        """Whether the node for ``block_id`` has no children (``KeyError`` if absent)."""
        return not (<_Node>self._by_block[block_id]).children

    def owner(self, long long block_id) -> int:
        """The sequence whose cells hold the node's block (``KeyError`` if absent)."""
        return (<_Node>self._by_block[block_id]).seq_id

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

    def seqs_in_use(self) -> set:
        """Sequences that still own at least one node."""
        return set(self._seq_count)

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

    cdef _Node _owned_ancestor(self, _Node node):
        cdef long long seq = node.seq_id
        cdef _Node up = node.parent
        while up is not None and up.seq_id != seq:
            up = up.parent
        # The root's seq_id is -1, which no sequence has, so the walk ends above it: none.
        return up


cdef bint _is_on_path(_Node tip, _Node deepest):
    """Whether ``tip`` is ``deepest`` or one of its ancestors."""
    cdef _Node node = deepest
    while node.depth > tip.depth:
        node = node.parent
    return node is tip
