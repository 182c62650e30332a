"""Prompt logprobs in the engine: every prompt token after the first is scored, the same
however the prompt is chunked or whatever the prefix cache holds; max_tokens 0 echoes alone."""

from __future__ import annotations

import time
from collections.abc import Callable

from tinyserve import protocol as p
from tinyserve.engine.core import EngineCore
from tinyserve.engine.runtime.runtime import LlamaRuntime

from .conftest import core_config
from .test_core import FRONTEND, Driver

PROMPT = "The quick brown fox jumps over the lazy dog, and then the dog sleeps in the sun."
# Chunking changes how llama.cpp splits the work, which moves logits in their last digits.
TOLERANCE = 1e-3


def submit(driver: Driver, rid: str, prompt: list[int], max_tokens: int, top: int) -> None:
    sampling = p.SamplingParams(logprobs=0)
    request = p.Submit(
        rid, FRONTEND, prompt, sampling, max_tokens,
        arrival_ns=time.monotonic_ns(), prompt_logprobs=top,
    )  # fmt: skip
    driver.core.submit(request)


def prompt_entries(driver: Driver, rid: str) -> list[list[object]]:
    return [e for u in driver.updates[rid] for e in u.prompt_logprobs]


def test_every_prompt_token_after_the_first_is_scored_with_its_alternatives(
    runtime: LlamaRuntime, tokenize: Callable[[str], list[int]]
) -> None:
    prompt = tokenize(PROMPT)
    driver = Driver(EngineCore(core_config(), runtime))
    submit(driver, "a", prompt, 1, 3)
    driver.run()
    entries = prompt_entries(driver, "a")
    assert len(entries) == len(prompt) - 1
    for logprob, top in entries:
        assert logprob <= 0.0
        assert len(top) == 3
        alternatives = [lp for _, lp in top]
        assert alternatives == sorted(alternatives, reverse=True)
        assert alternatives[0] >= logprob  # the best one is at least as likely as the prompt's


def test_the_last_prompt_entry_matches_the_generated_tokens_logprob(
    runtime: LlamaRuntime, tokenize: Callable[[str], list[int]]
) -> None:
    """Greedy generation scores its token from the prompt's last row; a prompt extended by that
    token scores it again as its last prompt token: the two must agree."""
    prompt = tokenize(PROMPT)
    driver = Driver(EngineCore(core_config(prefix_cache=False), runtime))
    first = driver.submit(prompt, 1, logprobs=0)
    driver.run()
    token, (generated_lp, _) = driver.tokens(first)[0], driver.final(first).logprobs[0]
    submit(driver, "b", [*prompt, token], 1, 0)
    driver.run()
    assert abs(prompt_entries(driver, "b")[-1][0] - generated_lp) < TOLERANCE


def test_chunking_and_the_prefix_cache_do_not_change_them(
    runtime: LlamaRuntime, tokenize: Callable[[str], list[int]]
) -> None:
    prompt = tokenize(PROMPT * 3)
    whole = Driver(EngineCore(core_config(chunk=256, max_batch_tokens=256), runtime))
    submit(whole, "w", prompt, 1, 0)
    whole.run()
    chunked = Driver(EngineCore(core_config(chunk=16), runtime))
    submit(chunked, "warm", prompt, 1, -1)  # leaves the prompt's blocks in the cache
    chunked.run()
    submit(chunked, "c", prompt, 1, 0)
    chunked.run()
    timeline = chunked.final("c").timeline
    assert timeline is not None
    assert timeline["prefix_reused_tokens"] == 0
    assert timeline["prefix_recomputed_tokens"] > 0  # the cache had it; logits needed a prefill
    a, b = prompt_entries(whole, "w"), prompt_entries(chunked, "c")
    assert len(a) == len(b) == len(prompt) - 1
    assert max(abs(x[0] - y[0]) for x, y in zip(a, b, strict=True)) < TOLERANCE


def test_max_tokens_0_returns_the_prompt_logprobs_and_no_token(
    runtime: LlamaRuntime, tokenize: Callable[[str], list[int]]
) -> None:
    prompt = tokenize(PROMPT)
    driver = Driver(EngineCore(core_config(), runtime))
    submit(driver, "z", prompt, 0, 1)
    driver.run()
    final = driver.final("z")
    assert final.finish_reason == p.FINISH_LENGTH
    assert driver.tokens("z") == []
    assert len(prompt_entries(driver, "z")) == len(prompt) - 1


def test_a_chunk_is_never_cut_short_by_other_requests_rows(
    runtime: LlamaRuntime, tokenize: Callable[[str], list[int]]
) -> None:
    """Splitting a prompt moves its logits: a request that wants them waits for a tick with
    room for its whole chunk, so its numbers do not depend on what else ran."""
    busy = tokenize(PROMPT)  # about 20 tokens
    prompt = tokenize("A second prompt, scored token by token, " * 2)
    config = core_config(prefix_cache=False, chunk=32, max_batch_tokens=len(busy) + 8)
    driver = Driver(EngineCore(config, runtime))
    driver.submit(busy, 4)
    submit(driver, "scored", prompt, 1, 0)
    driver.run()
    timeline = driver.final("scored").timeline
    assert timeline is not None
    assert [c["tokens"] for c in timeline["prefill"]] == [len(prompt)]  # whole, a tick later
    alone = Driver(EngineCore(core_config(prefix_cache=False, chunk=32), runtime))
    submit(alone, "alone", prompt, 1, 0)
    alone.run()
    assert prompt_entries(driver, "scored") == prompt_entries(alone, "alone")
