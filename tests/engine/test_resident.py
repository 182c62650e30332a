"""``--kv-layout slots``: a KV stream per slot, and the prefix a slot keeps for the next grant
(``engine/resident.py``), through the real core and model."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tinyserve.engine.core import REJECT_TOO_LONG, EngineCore
from tinyserve.engine.resident import SlotPrefixes, common_start
from tinyserve.engine.runtime import LlamaRuntime, RuntimeSpec

from .conftest import core_config
from .test_core import Driver
from .test_forks import PROMPT, check_a_choice_granted_while_the_first_decodes, submit_choices

# 4 slots of 256 cells: llama.cpp rounds a stream up to 256.
SLOTS = {"kv_layout": "slots", "ctx": 1024, "slots": 4}
STORY = "Once upon a time, in a small village by the sea, there lived an old fisherman who"


@pytest.fixture(scope="module")
def slot_runtime() -> Iterator[LlamaRuntime]:
    rt = LlamaRuntime(RuntimeSpec.from_config(core_config(**SLOTS)))
    yield rt
    rt.close()


def slot_driver(runtime: LlamaRuntime, **overrides: object) -> Driver:
    return Driver(EngineCore(core_config(**{**SLOTS, **overrides}), runtime))


@given(st.lists(st.integers(0, 3), max_size=12), st.lists(st.integers(0, 3), max_size=12))
def test_common_start_is_the_shared_first_tokens(a: list[int], b: list[int]) -> None:
    shared = [x == y for x, y in zip(a, b, strict=False)]
    assert common_start(a, b) == (shared.index(False) if False in shared else len(shared))


def test_the_lowest_free_slot_unless_one_keeps_enough_of_the_prompt() -> None:
    slots = SlotPrefixes(4, min_reuse=3)
    slots.keep(0, [1, 2])
    slots.keep(2, [1, 2, 3, 4, 5])
    slots.keep(3, [1, 2, 3, 9])
    assert slots.choose([1, 2, 3, 4, 5, 6], [0, 1, 2, 3]) == (2, 5)
    assert slots.choose([1, 2, 3, 4, 5], [0, 1, 2, 3]) == (2, 4)  # never the last token
    assert slots.choose([1, 2, 7, 8], [1, 0, 2, 3]) == (1, 0)  # 2 < min_reuse: lowest free
    assert slots.choose([1, 2, 7, 8], [0, 1]) == (0, 2)  # what the lowest keeps still counts
    assert slots.choose([1, 2, 3, 4, 5, 6], [0, 1, 2], reuse=False) == (0, 0)
    assert slots.stats.lookups == 4 and slots.stats.hit_tokens == 5 + 4 + 0 + 2
    slots.take(2)
    assert slots.choose([1, 2, 3, 4, 5, 6], [2, 3]) == (3, 3)


def test_a_conversation_goes_on_in_the_slot_that_keeps_it(
    slot_runtime: LlamaRuntime, tokenize: Callable[[str], list[int]]
) -> None:
    """The second turn takes the slot holding the first turn's prompt and reply, though a
    lower slot is free, and prefills only what is new; its first token is the one a cold
    prefill of the whole prompt predicts."""
    d = slot_driver(slot_runtime)
    first = tokenize(STORY)
    d.submit(tokenize("Hello there."), 4)  # slot 0 from here on
    d.step()
    rid = d.submit(first, 8)  # slot 1
    d.run()
    second = first + d.tokens(rid) + tokenize(" And then")[1:]
    kept = len(first) + len(d.tokens(rid)) - 1  # the last sampled token was never decoded
    rid2 = d.submit(second, 4)
    d.run()
    timeline = d.final(rid2).timeline
    assert timeline is not None and timeline["slot"]["index"] == 1
    assert d.final(rid2).cached_tokens == kept
    assert sum(c["tokens"] for c in timeline["prefill"]) == len(second) - kept

    cold = slot_driver(slot_runtime, prefix_cache=False)
    rid3 = cold.submit(second, 4)
    cold.run()
    assert cold.final(rid3).cached_tokens == 0
    assert cold.tokens(rid3)[0] == d.tokens(rid2)[0]


def test_a_request_longer_than_its_slots_cells_is_refused(
    slot_runtime: LlamaRuntime,
) -> None:
    """In this layout a request may fill one slot's cells (256), not the context (1024)."""
    d = slot_driver(slot_runtime)
    assert d.core.n_ctx == slot_runtime.n_ctx_seq == 256
    ok = d.submit(list(range(100, 300)), 56)
    too_long = d.submit(list(range(100, 300)), 57)
    d.run()
    assert d.final(ok).finish_reason == "length"
    assert d.final(too_long).finish_reason == "rejected"
    assert d.final(too_long).detail == REJECT_TOO_LONG


def test_choices_copy_the_prompt_across_slots(
    slot_runtime: LlamaRuntime, tokenize: Callable[[str], list[int]]
) -> None:
    """n > 1: each choice's stream gets a copy of the first's (llama.cpp copies streams
    whole); greedy choices then continue the prompt alike."""
    d = slot_driver(slot_runtime, prefix_cache=False)
    ids = submit_choices(d, tokenize(PROMPT), 3, 8, temperature=0.0)
    d.run()
    outputs = [d.tokens(rid) for rid in ids]
    assert len(outputs[0]) == 8 and outputs[1] == outputs[0] and outputs[2] == outputs[0]


def test_a_failed_request_leaves_nothing_kept(
    slot_runtime: LlamaRuntime, tokenize: Callable[[str], list[int]]
) -> None:
    d = slot_driver(slot_runtime)
    rid = d.submit(tokenize(STORY), 4)
    d.step()
    d.core.cancel(rid, "error", "test")
    d.run()
    assert d.core.resident is not None and d.core.resident.kept == [[], [], [], []]


def test_a_choice_granted_while_the_first_decodes_copies_its_stream(
    slot_runtime: LlamaRuntime, tokenize: Callable[[str], list[int]]
) -> None:
    """As with one pool of cells, though the copy is of the first's whole stream, minus the
    cells from the prompt's last token on."""
    d = slot_driver(slot_runtime, prefix_cache=False)
    check_a_choice_granted_while_the_first_decodes(d, tokenize)
