"""The runner (``engine/model/runner.py``) with the real model: it writes the planned rows, decodes
once, and returns what each row computed, a row's failure included; it decides nothing."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tinyserve import protocol as p
from tinyserve.engine.model.runner import Row, Runner
from tinyserve.engine.request.sequence import Sequence, SequenceStatus
from tinyserve.engine.runtime.runtime import LlamaRuntime
from tinyserve.errors import RequestError

FRONTEND = "f" * 32


@pytest.fixture
def runner(runtime: LlamaRuntime) -> Iterator[Runner]:
    runtime.clear()
    runner = Runner(runtime)
    yield runner
    for sampler in runner.samplers.values():
        sampler.free()
    runtime.clear()


def started(runner: Runner, slot: int, prompt: list[int], **request: object) -> Sequence:
    """A request that holds ``slot`` with nothing of its prompt in it yet."""
    logprobs = int(request.pop("logprobs", -1))  # type: ignore[call-overload]
    sampling = p.SamplingParams(logprobs=logprobs)
    submit = p.Submit(f"r{slot}", FRONTEND, prompt, sampling, 8, **request)  # type: ignore[arg-type]
    seq = Sequence(submit, status=SequenceStatus.PREFILL, slot=slot)
    runner.start(seq)
    return seq


def test_a_rows_failure_comes_back_with_it_and_the_other_rows_are_computed(
    runner: Runner, runtime: LlamaRuntime
) -> None:
    good = started(runner, 0, list(range(100, 130)))
    too_many = started(runner, 1, list(range(200, 240)))  # 30 + 40 rows: over the 64
    bad = started(runner, 2, list(range(300, 320)), logprobs=runtime.n_vocab)
    plan = [Row(good, 30, True), Row(too_many, 40, True), Row(bad, 20, True)]
    outcome = runner.run(plan)
    assert outcome.status == 0
    assert [c.row for c in outcome.computed] == plan
    first, second, third = outcome.computed
    assert first.error is None and first.sampled is not None and first.logits_row == 29
    assert isinstance(second.error, IndexError) and second.sampled is None
    assert isinstance(third.error, RequestError) and third.sampled is None
    assert "vocabulary" in str(third.error)
    batch = outcome.batch
    assert (batch.requests, batch.tokens, batch.prefill_tokens, batch.decode_tokens) == (
        2,
        50,
        50,
        0,
    )
    # It decides nothing: where each request stands is the scheduler's to change.
    for seq in (good, too_many, bad):
        assert (seq.status, seq.n_past, seq.output_ids) == (SequenceStatus.PREFILL, 0, [])


def test_it_samples_and_scores_only_what_a_row_asks(runner: Runner) -> None:
    prompt = list(range(100, 120))
    scored = started(runner, 0, prompt, prompt_logprobs=2)
    plain = started(runner, 1, prompt)
    outcome = runner.run([Row(scored, 12, False), Row(plain, 12, False)])
    scored_chunk, plain_chunk = outcome.computed
    assert scored_chunk.sampled is None and plain_chunk.sampled is None
    assert plain_chunk.prompt_logprobs is None
    entries = scored_chunk.prompt_logprobs
    assert entries is not None and len(entries) == 12  # tokens 1..12 of the prompt
    assert all(len(top) == 2 for _, top in entries)
    scored.n_past = plain.n_past = 12  # what the scheduler does with the results
    outcome = runner.run([Row(scored, 8, True), Row(plain, 8, True)])
    scored_chunk, plain_chunk = outcome.computed
    assert scored_chunk.prompt_logprobs is not None and len(scored_chunk.prompt_logprobs) == 7
    assert scored_chunk.sampled is not None and plain_chunk.sampled is not None
    assert scored_chunk.sampled.token == plain_chunk.sampled.token  # greedy, the same prompt
    assert scored_chunk.sampled.logprobs is None  # logprobs of the output were not asked for
