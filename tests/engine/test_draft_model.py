"""Guesses from a draft model (``--draft-model``), here the default model drafting for
itself: replies equal to those without speculation, nearly every guess taken, each slot's
cells following its text, and a draft of another vocabulary refused at start."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import gguf
import pytest
from gguf.scripts.gguf_new_metadata import MetadataDetails

from tests.chat_templates import model_with_metadata
from tinyserve.engine.core import EngineCore
from tinyserve.engine.runtime.runtime import LlamaRuntime, RuntimeSpec
from tinyserve.engine.speculation.draft_model import Ask, DraftModel
from tinyserve.errors import EngineFatalError

from .conftest import core_config
from .test_core import Driver
from .test_speculation import FREE, REPEATING, FreeRows


@pytest.fixture(scope="module")
def draft() -> Iterator[LlamaRuntime]:
    # attends as the target (``exact_runtime``) does: drafting for itself, it guesses right
    rt = LlamaRuntime(RuntimeSpec.from_config(core_config(flash_attn="on")))
    yield rt
    rt.close()


def run_all(
    runtime: LlamaRuntime,
    draft: LlamaRuntime | None,
    prompts: list[list[int]],
    **sampling: object,
) -> tuple[Driver, list[str]]:
    speculate = "draft" if draft is not None else "off"
    config = core_config(speculate=speculate, draft_model="/draft.gguf" if draft else None)
    core = EngineCore(config, runtime, draft=draft)
    core.scheduler.guessing.step_cost = FreeRows()
    driver = Driver(core)
    rids = [driver.submit(ids, max_tokens=24, **sampling) for ids in prompts]
    driver.run(max_ticks=2000)
    return driver, rids


@pytest.mark.parametrize(
    "sampling", [{}, {"temperature": 0.8, "seed": 5}], ids=["greedy", "sampled"]
)
def test_replies_are_the_same_with_a_draft_model_and_without(
    exact_runtime: LlamaRuntime,
    draft: LlamaRuntime,
    tokenize: Callable[[str], list[int]],
    sampling: dict[str, object],
) -> None:
    prompts = [tokenize(text) for text in REPEATING[:2] + FREE[:1]]
    off, off_ids = run_all(exact_runtime, None, prompts, **sampling)
    on, on_ids = run_all(exact_runtime, draft, prompts, **sampling)
    for a, b in zip(off_ids, on_ids, strict=True):
        assert on.tokens(b) == off.tokens(a)
        assert on.final(b).finish_reason == off.final(a).finish_reason
    guesses = [g for rid in on_ids for g in on.finishes[rid].timeline.guesses]
    guessed, accepted = sum(g[1] for g in guesses), sum(g[2] for g in guesses)
    assert guessed > 0 and accepted > 0
    if not sampling:
        # a model drafting for itself greedily is right but where a batch's shape moves a
        # near tie; sampled, its guess holds with the chance the sampler gives it
        assert accepted >= 0.9 * guessed, (guessed, accepted)
        assert len(on.batches) < len(off.batches) / 2  # free text too: many tokens per step


def test_each_slot_keeps_the_text_it_read_and_drops_what_parts_from_it(
    runtime: LlamaRuntime, draft: LlamaRuntime, tokenize: Callable[[str], list[int]]
) -> None:
    model = DraftModel(draft, runtime)
    first = tokenize(REPEATING[1])
    guesses = model.guesses([Ask(0, first, 4)])
    assert len(guesses[0]) == 4
    assert model.held[0] == first + guesses[0][:3]  # the last guess is never read in
    # the target took two guesses and picked its own token after them
    taken = first + guesses[0][:2] + [guesses[0][2] + 1]
    again = model.guesses([Ask(0, taken, 3), Ask(1, first[:5], 2)])
    assert model.held[0][: len(taken)] == taken and len(again[0]) == 3
    assert model.held[1] == first[:5] + again[1][:1]
    # another text in slot 0 keeps only the common start (the first token, BOS)
    other = tokenize(FREE[0])
    assert len(model.guesses([Ask(0, other, 2)])[0]) == 2
    assert model.held[0] == other + model.held[0][len(other) :]
    assert len(model.held[0]) == len(other) + 1


def test_a_draft_model_of_another_vocabulary_is_refused_with_one_line(
    runtime: LlamaRuntime, tmp_path: Path
) -> None:
    bos = MetadataDetails(gguf.GGUFValueType.UINT32, 7)
    path = model_with_metadata({gguf.Keys.Tokenizer.BOS_ID: bos}, tmp_path, "other-bos")
    other = LlamaRuntime(RuntimeSpec.from_config(core_config(), str(path)))
    try:
        with pytest.raises(EngineFatalError) as refused:
            DraftModel(other, runtime)
    finally:
        other.close()
    message = str(refused.value)
    assert "\n" not in message and "other-bos.gguf" in message and "beginning token" in message
