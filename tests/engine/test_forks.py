"""n > 1 in the engine: choices of one prompt share its prefill (KV copied into each one's
slot) and sample with their own samplers."""

from __future__ import annotations

import time
from collections.abc import Callable

from tinyserve import protocol as p
from tinyserve.engine.core import EngineCore
from tinyserve.engine.runtime.runtime import LlamaRuntime

from .conftest import core_config
from .test_core import FRONTEND, Driver

PROMPT = "Once upon a time, in a small village by the sea, there lived an old fisherman who"


def submit_choices(
    driver: Driver, prompt: list[int], n: int, max_tokens: int, **sampling: object
) -> list[str]:
    """n requests as the frontend sends them for n choices: seeds seed + index."""
    ids = [f"c{driver._n}-{i}" for i in range(n)]
    driver._n += 1
    seed = sampling.pop("seed", None)
    for i, rid in enumerate(ids):
        params = p.SamplingParams(seed=None if seed is None else seed + i, **sampling)  # type: ignore[arg-type]
        request = p.Submit(
            rid, FRONTEND, prompt, params, max_tokens,
            arrival_ns=time.monotonic_ns(), fork_of=ids[0] if i else "",
        )  # fmt: skip
        driver.core.submit(request)
    return ids


def test_greedy_choices_copy_the_prompt_and_continue_it_like_the_first(
    runtime: LlamaRuntime, tokenize: Callable[[str], list[int]]
) -> None:
    prompt = tokenize(PROMPT)
    driver = Driver(EngineCore(core_config(prefix_cache=False), runtime))
    ids = submit_choices(driver, prompt, 3, 8, temperature=0.0)
    driver.run()
    outputs = [driver.tokens(rid) for rid in ids]
    assert len(outputs[0]) == 8
    assert outputs[1] == outputs[0] and outputs[2] == outputs[0]
    # One prefill: the batches decoded the prompt's tokens once.
    assert sum(b.prefill_tokens for b in driver.batches) == len(prompt)
    for rid in ids[1:]:
        timeline = driver.final(rid).timeline
        assert timeline is not None
        assert timeline["shared_prefill"] == {"request_id": ids[0], "tokens": len(prompt)}
        assert timeline["prefill"] == []
    assert "shared_prefill" not in (driver.final(ids[0]).timeline or {})


def test_seeded_choices_differ_and_reproduce(
    runtime: LlamaRuntime, tokenize: Callable[[str], list[int]]
) -> None:
    prompt = tokenize(PROMPT)

    def run() -> list[list[int]]:
        driver = Driver(EngineCore(core_config(prefix_cache=False), runtime))
        ids = submit_choices(driver, prompt, 3, 12, temperature=1.0, seed=7)
        driver.run()
        return [driver.tokens(rid) for rid in ids]

    first, second = run(), run()
    assert first == second
    assert len({tuple(t) for t in first}) == 3


def test_a_choice_granted_after_the_first_ended_prefills_alone(
    runtime: LlamaRuntime, tokenize: Callable[[str], list[int]]
) -> None:
    prompt = tokenize(PROMPT)
    driver = Driver(EngineCore(core_config(prefix_cache=False, slots=1), runtime))
    ids = submit_choices(driver, prompt, 2, 4, temperature=0.0)
    driver.run()
    assert driver.tokens(ids[1]) == driver.tokens(ids[0])
    timeline = driver.final(ids[1]).timeline
    assert timeline is not None
    # With one slot the second choice waits until the first is done: it goes alone.
    assert "shared_prefill" not in timeline
    assert sum(c["tokens"] for c in timeline["prefill"]) == len(prompt)


def check_a_choice_granted_while_the_first_decodes(
    driver: Driver, tokenize: Callable[[str], list[int]]
) -> None:
    """Every slot but one held for a tick, then two greedy choices: the second gets a slot
    only once the first decodes, copies all of its prompt but the last token, prefills that
    one and continues alike. The holders' prompts are as long as the choices' so that all
    prefill in the first tick (a tick's prompt pieces are of one length)."""
    prompt = tokenize(PROMPT)
    for n in range(len(driver.core.slots()) - 1):
        driver.submit([n + 1, *prompt[1:]], 1)
    ids = submit_choices(driver, prompt, 2, 6, temperature=0.0)
    driver.run()
    assert driver.tokens(ids[1]) == driver.tokens(ids[0])
    timeline = driver.final(ids[1]).timeline
    assert timeline is not None
    assert timeline["shared_prefill"] == {"request_id": ids[0], "tokens": len(prompt) - 1}
    assert [c["tokens"] for c in timeline["prefill"]] == [1]


def test_a_choice_granted_while_the_first_decodes_copies_all_but_the_last_token(
    runtime: LlamaRuntime, tokenize: Callable[[str], list[int]]
) -> None:
    driver = Driver(EngineCore(core_config(prefix_cache=False, slots=2), runtime))
    check_a_choice_granted_while_the_first_decodes(driver, tokenize)


def test_a_forked_choices_decode_time_starts_at_its_first_token(
    runtime: LlamaRuntime, tokenize: Callable[[str], list[int]]
) -> None:
    """first_token + the decode runs = finish (up to the finishing step itself), for a choice
    that waited for another's prefill as for any: the wait is its slot-to-first-token gap."""
    driver = Driver(EngineCore(core_config(prefix_cache=False), runtime))
    ids = submit_choices(driver, tokenize(PROMPT * 3), 2, 6, temperature=0.0, ignore_eos=True)
    driver.run()
    timelines = [driver.final(rid).timeline for rid in ids]
    assert timelines[0] is not None and timelines[1] is not None
    leader_prefill_ms = sum(c["ms"] for c in timelines[0]["prefill"])
    for timeline in timelines:
        end_of_decode = timeline["first_token_ms"] + timeline["decode"]["ms"]
        assert 0 <= timeline["finish"]["ms"] - end_of_decode < leader_prefill_ms


def test_a_choice_that_arrives_while_the_first_decodes_still_copies_its_prompt(
    runtime: LlamaRuntime, tokenize: Callable[[str], list[int]]
) -> None:
    prompt = tokenize(PROMPT)
    driver = Driver(EngineCore(core_config(prefix_cache=False), runtime))
    [first] = submit_choices(driver, prompt, 1, 8, temperature=0.0)
    driver.step()  # its prompt is in: it decodes
    late = p.Submit(
        "late", FRONTEND, prompt, p.SamplingParams(), 4,
        arrival_ns=time.monotonic_ns(), fork_of=first,
    )  # fmt: skip
    driver.core.submit(late)
    driver.run()
    assert driver.tokens("late") == driver.tokens(first)[:4]
    timeline = driver.final("late").timeline
    assert timeline is not None
    assert timeline["shared_prefill"] == {"request_id": first, "tokens": len(prompt) - 1}
