"""RadixTree: worked examples, then a stateful comparison with the dict-of-tuples RefRadix."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from tinyserve_native.radix import Match, RadixTree

from .reference import RefRadix

BS = 2


def unpinned(_block: int) -> int:
    return 0


@pytest.fixture
def tree() -> RadixTree:
    return RadixTree(BS)


def test_empty_tree_matches_nothing(tree: RadixTree) -> None:
    assert tree.match([1, 2, 3]) == Match(0, [])
    assert (tree.n_nodes, tree.block_size, tree.lru_leaf(unpinned)) == (0, BS, -1)


def test_match_returns_the_longest_full_block_prefix(tree: RadixTree) -> None:
    assert tree.insert([1, 2, 3, 4, 5, 6], [10, 11, 12]) == [10, 11, 12]
    assert tree.match([1, 2, 3, 4, 9, 9]) == Match(4, [10, 11])
    assert tree.match([1, 2, 3, 4, 5]) == Match(4, [10, 11])  # 5 alone is no block
    assert tree.match([1, 2, 3, 4, 5, 6, 7, 8]) == Match(6, [10, 11, 12])
    assert tree.match([2, 1]) == Match(0, [])


def test_insert_keeps_existing_nodes_and_reports_them(tree: RadixTree) -> None:
    tree.insert([1, 2, 3, 4], [10, 11])
    assert tree.insert([1, 2, 3, 4, 5, 6], [20, 21, 22]) == [10, 11, 22]
    assert tree.match([1, 2, 3, 4, 5, 6]) == Match(6, [10, 11, 22])
    assert tree.n_nodes == 3
    assert 20 not in tree  # the duplicate the tree did not take


def test_path_and_depth_name_each_block(tree: RadixTree) -> None:
    tree.insert([1, 2], [10])
    tree.insert([1, 2, 3, 4], [20, 21])
    assert tree.path_tokens(21) == [1, 2, 3, 4]
    assert tree.path_tokens(10) == [1, 2]
    assert (tree.depth(10), tree.depth(21)) == (0, 1)
    with pytest.raises(KeyError):
        tree.depth(20)


def test_only_a_leaf_can_be_removed(tree: RadixTree) -> None:
    tree.insert([1, 2, 3, 4, 5, 6], [10, 11, 12])
    assert not tree.is_leaf(11)
    with pytest.raises(ValueError):
        tree.remove_leaf(11)
    tree.remove_leaf(12)
    assert tree.is_leaf(11)
    tree.remove_leaf(11)
    tree.remove_leaf(10)
    assert tree.n_nodes == 0
    with pytest.raises(KeyError):
        tree.remove_leaf(10)


def leaves_in_eviction_order(tree: RadixTree) -> list[int]:
    order = []
    while (leaf := tree.lru_leaf(unpinned)) >= 0:
        order.append(leaf)
        tree.remove_leaf(leaf)
    return order


def test_leaves_are_evicted_least_recently_used_first(tree: RadixTree) -> None:
    tree.insert([1, 1], [10])
    tree.insert([2, 2], [20])
    tree.insert([3, 3, 4, 4], [30, 31])
    assert tree.lru_leaf(unpinned) == 10
    tree.match([1, 1, 0])
    tree.match([3, 3])  # touches 30 only: the leaf below it is still cold
    # 30 becomes a leaf when 31 goes, at the place its last use gives it: after 20.
    assert leaves_in_eviction_order(tree) == [20, 31, 10, 30]


def test_pinned_leaves_are_skipped_and_stay_in_order(tree: RadixTree) -> None:
    tree.insert([1, 1], [10])
    tree.insert([2, 2], [20])
    tree.insert([3, 3], [30])
    pinned = {10, 20}
    assert tree.lru_leaf(lambda b: int(b in pinned)) == 30
    assert tree.lru_leaf(lambda b: int(b in {10})) == 20
    pinned = {10, 20, 30}
    assert tree.lru_leaf(lambda b: int(b in pinned)) == -1
    assert leaves_in_eviction_order(tree) == [10, 20, 30]


def test_a_refcount_that_raises_loses_no_leaf(tree: RadixTree) -> None:
    tree.insert([1, 1], [10])
    tree.insert([2, 2], [20])

    def broken(block: int) -> int:
        if block == 20:
            raise IndexError(block)
        return 1

    with pytest.raises(IndexError):
        tree.lru_leaf(broken)
    assert leaves_in_eviction_order(tree) == [10, 20]


def test_an_inner_node_is_not_evictable_until_its_last_child_goes(tree: RadixTree) -> None:
    tree.insert([1, 1, 2, 2], [10, 11])
    tree.insert([1, 1, 3, 3], [12, 13])
    tree.match([5, 5])
    assert tree.lru_leaf(lambda b: int(b != 10)) == -1  # 10 is unpinned but has children
    assert leaves_in_eviction_order(tree) == [11, 13, 10]


def test_nothing_is_partly_matched_below_a_tail(tree: RadixTree) -> None:
    # Found by the state machine below: a full block that starts with a tail's tokens is the
    # tail's sibling, not its child.
    tree.insert([0, 0], [10])
    assert tree.add_tail(-1, [0], 11) == 11
    assert tree.partial(-1, [0]) == (1, 11)  # 11 is the one touched last
    assert tree.partial(11, [0]) == (0, -1)


def test_extend_hangs_blocks_below_a_node(tree: RadixTree) -> None:
    tree.insert([1, 2, 3, 4], [10, 11])
    assert tree.extend(11, [5, 6, 7, 8], [12, 13]) == [12, 13]
    assert tree.match([1, 2, 3, 4, 5, 6, 7, 8]) == Match(8, [10, 11, 12, 13])
    assert tree.extend(10, [3, 4], [14]) == [11]  # already there: the tree's id
    assert tree.extend(-1, [9, 9], [15]) == [15]
    with pytest.raises(KeyError):
        tree.extend(99, [9, 9], [16])
    assert tree.n_nodes == 5


def test_touching_a_hot_leaf_often_keeps_the_order(tree: RadixTree) -> None:
    tree.insert([1, 1], [10])
    tree.insert([2, 2], [20])
    for _ in range(1000):  # stale heap entries pile up and are swept
        tree.match([2, 2])
    assert leaves_in_eviction_order(tree) == [10, 20]


@pytest.mark.parametrize(
    ("tokens", "ids"),
    [
        ([1, 2, 3], [10, 11]),  # not whole blocks
        ([1, 2, 3, 4], [10]),  # one id short
        ([5, 6, 7, 8], [40, 40]),  # repeated id
        ([5, 6], [10]),  # id already in the tree
    ],
)
def test_bad_inserts_raise_and_change_nothing(
    tree: RadixTree, tokens: list[int], ids: list[int]
) -> None:
    tree.insert([1, 2, 3, 4], [10, 11])
    with pytest.raises(ValueError):
        tree.insert(tokens, ids)
    assert tree.n_nodes == 2
    assert tree.match([1, 2, 3, 4, 5, 6, 7, 8]) == Match(4, [10, 11])


def test_a_non_integer_block_id_fails_before_any_change(tree: RadixTree) -> None:
    with pytest.raises(TypeError):
        tree.insert([1, 2, 3, 4], [10, "11"])  # type: ignore[list-item]
    assert tree.n_nodes == 0


def test_partial_finds_the_longest_start_of_a_block_below() -> None:
    tree = RadixTree(4)
    tree.insert([1, 2, 3, 4, 5, 6, 7, 8], [10, 11])
    tree.insert([1, 2, 3, 4, 5, 6, 9, 9], [10, 12])
    assert tree.partial(-1, [1, 2, 7]) == (2, 10)  # below the root: block [1, 2, 3, 4]
    assert tree.partial(10, [5, 6, 7]) == (3, 11)
    assert tree.partial(10, [5, 6, 9, 9, 9]) == (3, 12)  # never a whole block: that is a match
    assert tree.partial(10, [5]) == (1, 12)  # a tie: the most recently used block
    tree.match([1, 2, 3, 4, 5, 6, 7, 8])
    assert tree.partial(10, [5]) == (1, 11)
    assert tree.partial(10, [8]) == (0, -1)
    assert tree.partial(11, [1]) == (0, -1)  # a leaf has nothing below
    assert tree.n_nodes == 3
    with pytest.raises(KeyError):
        tree.partial(99, [1])


def test_a_tail_is_a_leaf_found_by_partial_and_never_by_match() -> None:
    tree = RadixTree(4)
    tree.insert([1, 2, 3, 4], [10])
    assert tree.add_tail(10, [5, 6], 11) == 11
    assert tree.add_tail(10, [5, 6], 12) == 11  # already there: the tree's id
    assert tree.match([1, 2, 3, 4, 5, 6]) == Match(4, [10])
    assert tree.partial(10, [5, 6, 7]) == (2, 11)
    assert tree.partial(10, [5]) == (1, 11)
    assert (tree.is_leaf(11), tree.depth(11), tree.path_tokens(11)) == (True, 1, [1, 2, 3, 4, 5, 6])
    with pytest.raises(ValueError):
        tree.extend(11, [7, 8, 9, 9], [13])  # nothing hangs from a tail
    with pytest.raises(ValueError):
        tree.add_tail(10, [5, 6, 7, 8], 13)  # a whole block is no tail
    assert tree.lru_leaf(unpinned) == 11
    tree.remove_leaf(11)
    assert tree.is_leaf(10)


def test_block_size_must_be_positive() -> None:
    with pytest.raises(ValueError):
        RadixTree(0)


TOKENS = st.lists(st.integers(0, 1), max_size=4 * BS + 1)


class RadixMachine(RuleBasedStateMachine):
    """Random insert/match/remove sequences on both models; answers and errors must agree."""

    def __init__(self) -> None:
        super().__init__()
        self.tree = RadixTree(BS)
        self.ref = RefRadix(BS)
        self.next_id = 0
        self.pinned: set[int] = set()

    def refcount(self, block_id: int) -> int:
        return int(block_id in self.pinned)

    def _both(self, name: str, *args: Any) -> None:
        try:
            expected: Any = getattr(self.ref, name)(*args)
        except (KeyError, ValueError) as exc:
            with pytest.raises(type(exc)):
                getattr(self.tree, name)(*args)
            return
        got = getattr(self.tree, name)(*args)
        assert (tuple(got) if name == "match" else got) == expected, (name, args)

    def _fresh_ids(self, n: int) -> list[int]:
        self.next_id += n
        return list(range(self.next_id - n, self.next_id))

    @rule(tokens=TOKENS, data=st.data())
    def insert(self, tokens: list[int], data: st.DataObject) -> None:
        tokens = tokens[: len(tokens) // BS * BS]
        ids = self._fresh_ids(len(tokens) // BS)
        in_tree = [node[0] for node in self.ref.nodes.values()]
        corrupt = data.draw(st.integers(0, 9))  # now and then, an id the caller must not pass
        if corrupt == 0 and ids and in_tree:
            ids[data.draw(st.integers(0, len(ids) - 1))] = data.draw(st.sampled_from(in_tree))
        elif corrupt == 1 and len(ids) >= 2:
            ids[-1] = ids[0]
        self._both("insert", tokens, ids)

    @rule(tokens=TOKENS, data=st.data())
    def extend(self, tokens: list[int], data: st.DataObject) -> None:
        tokens = tokens[: len(tokens) // BS * BS]
        in_tree = [node[0] for node in self.ref.nodes.values()]
        parent = data.draw(st.sampled_from([-1, 99, *in_tree]))
        self._both("extend", parent, tokens, self._fresh_ids(len(tokens) // BS))

    @rule(tokens=st.lists(st.integers(0, 1), min_size=0, max_size=BS), data=st.data())
    def add_tail(self, tokens: list[int], data: st.DataObject) -> None:
        in_tree = [node[0] for node in self.ref.nodes.values()]
        parent = data.draw(st.sampled_from([-1, 99, *in_tree]))
        self._both("add_tail", parent, tokens, self._fresh_ids(1)[0])

    @rule(tokens=TOKENS)
    def match(self, tokens: list[int]) -> None:
        self._both("match", tokens)

    @rule(tokens=TOKENS, data=st.data())
    def partial(self, tokens: list[int], data: st.DataObject) -> None:
        in_tree = [node[0] for node in self.ref.nodes.values()]
        self._both("partial", data.draw(st.sampled_from([-1, 99, *in_tree])), tokens)

    @rule(data=st.data())
    def pin_or_unpin(self, data: st.DataObject) -> None:
        in_tree = [node[0] for node in self.ref.nodes.values()]
        if in_tree:
            self.pinned ^= {data.draw(st.sampled_from(in_tree))}

    @rule()
    def evict_lru_leaf(self) -> None:
        victim = self.ref.lru_leaf(self.refcount)
        assert self.tree.lru_leaf(self.refcount) == victim
        if victim >= 0:
            self._both("remove_leaf", victim)

    @rule(data=st.data())
    def remove_a_leaf(self, data: st.DataObject) -> None:
        leaves = self.ref.leaves_lru()
        if leaves:
            self._both("remove_leaf", data.draw(st.sampled_from(leaves)))

    @rule(block_id=st.integers(0, 40))
    def remove_any(self, block_id: int) -> None:
        self._both("remove_leaf", block_id)  # often not a leaf, or not in the tree

    @invariant()
    def trees_agree(self) -> None:
        assert self.tree.n_nodes == len(self.ref.nodes)
        assert self.tree.lru_leaf(self.refcount) == self.ref.lru_leaf(self.refcount)
        assert self.tree.lru_leaf(unpinned) == self.ref.lru_leaf(unpinned)
        for block_id, _ in self.ref.nodes.values():
            assert block_id in self.tree
            assert self.tree.is_leaf(block_id) == self.ref.is_leaf(block_id)
            assert self.tree.depth(block_id) == self.ref.depth(block_id)
            assert self.tree.last_used(block_id) == self.ref.last_used(block_id)
            assert self.tree.path_tokens(block_id) == self.ref.path_tokens(block_id)


RadixMachine.TestCase.settings = settings(max_examples=100, stateful_step_count=25, deadline=None)
test_radix_matches_reference = RadixMachine.TestCase
