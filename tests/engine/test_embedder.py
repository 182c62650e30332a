"""The engine's embeddings: vectors, batching across ticks beside generation, and the one
``Embedded`` every request gets however it ends."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import pytest

from tinyserve.engine.core import EngineCore
from tinyserve.engine.embeddings import embedder as embedder_module
from tinyserve.engine.embeddings.embed_queue import Piece
from tinyserve.engine.runtime.runtime import LlamaRuntime
from tinyserve.errors import RequestError
from tinyserve.protocol import (
    FINISH_CANCELLED,
    FINISH_ERROR,
    FINISH_REJECTED,
    FINISH_STOP,
    REJECT_DRAINING,
    REJECT_QUEUE_FULL,
    Embed,
    Embedded,
    SamplingParams,
    Submit,
)

from .conftest import core_config

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "hello",
    "Embeddings map text to vectors of numbers.",
]


@pytest.fixture
def core(runtime: LlamaRuntime) -> Iterator[EngineCore]:
    core = EngineCore(core_config(embedding_max_tokens=64, max_queue=4), runtime)
    yield core
    core.embeddings.close()


def embed(request_id: str, inputs: list[list[int]], frontend: str = "fe") -> Embed:
    return Embed(request_id, frontend, inputs)


def vectors(ended: Embedded) -> list[np.ndarray]:
    return [np.frombuffer(v, "<f4") for v in ended.vectors]


def run_until_ended(core: EngineCore, limit: int = 50) -> list[Embedded]:
    ended: list[Embedded] = []
    for _ in range(limit):
        ended += core.step().embedded
        if not core.has_work():
            return ended
    raise AssertionError("the engine never finished its work")


def test_each_input_gets_a_unit_vector_in_order(
    core: EngineCore, tokenize: Callable[[str], list[int]]
) -> None:
    ids = [tokenize(text) for text in TEXTS]
    core.embed(embed("r", ids))
    (ended,) = run_until_ended(core)
    assert (ended.request_id, ended.finish_reason) == ("r", FINISH_STOP)
    assert ended.prompt_tokens == sum(map(len, ids))
    got = vectors(ended)
    assert len(got) == 3
    assert [v.shape for v in got] == [(576,)] * 3
    assert all(abs(float(np.linalg.norm(v)) - 1) < 1e-5 for v in got)
    # each alone gives the same vector: batching with others changes nothing
    for i, one in enumerate(ids):
        core.embed(embed(f"alone{i}", [one]))
        (alone,) = run_until_ended(core)
        assert float(vectors(alone)[0] @ got[i]) > 1 - 1e-5
    # different texts are different vectors
    assert float(got[0] @ got[2]) < 0.999


def test_beside_generation_each_tick_runs_a_bounded_part_splitting_inputs(
    runtime: LlamaRuntime, tokenize: Callable[[str], list[int]]
) -> None:
    """With a share of 1 every tick runs a part: of --embedding-tick-tokens tokens while a
    generation request runs (inputs split across ticks), of a whole batch once it ended; a
    split input's vector is the one it has whole."""
    # parts under 64 rows: llama.cpp multiplies batches of 64 rows or more with another kernel
    config = core_config(embedding_max_tokens=48, embedding_tick_tokens=4, embedding_share=1)
    core = EngineCore(config, runtime)
    one = tokenize(TEXTS[0])  # 10 tokens
    core.embed(embed("whole", [one]))
    (whole,) = run_until_ended(core)
    core.submit(Submit("gen", "fe", tokenize("Count to ten:"), SamplingParams(), max_tokens=6))
    core.embed(embed("many", [one] * 12))
    parts, ended = [], []
    while core.has_work():
        generating = bool(core.scheduler.by_id)
        report = core.step()
        if report.embed_batch is not None:
            parts.append((generating, report.embed_batch.tokens))
        ended += report.embedded
    core.embeddings.close()
    # parts of at most 4 tokens while the request ran: an input split 4 + 4 + 2 (the next
    # one does not begin beside it), then a batch of whole inputs at a time
    assert parts[:6] == [(True, 4), (True, 4), (True, 2)] * 2
    assert [tokens for _, tokens in parts[6:]] == [40, 40, 20]
    (done,) = ended
    assert done.finish_reason == FINISH_STOP and len(done.vectors) == 12
    assert done.prompt_tokens == 120
    # split 4 + 4 + 2 or whole: the same vector, up to the last bits
    assert all(float(v @ vectors(whole)[0]) > 1 - 1e-5 for v in vectors(done))


def test_the_policy_orders_embedding_requests(
    runtime: LlamaRuntime, tokenize: Callable[[str], list[int]]
) -> None:
    """Under --policy priority a later request of a higher priority runs first; each has a
    timeline: accepted, taken (with the rule), a part per tick, finished."""
    config = core_config(embedding_max_tokens=16, policy="priority")
    core = EngineCore(config, runtime)
    one = tokenize(TEXTS[0])
    core.embed(Embed("low", "fe", [one, one], priority=0))
    core.embed(Embed("high", "fe", [one, one], priority=5))
    order = [e.request_id for e in run_until_ended(core)]
    core.embeddings.close()
    assert order == ["high", "low"]
    timeline = core.timeline_of("low")
    assert timeline is not None and timeline["status"] == "finished"
    assert timeline["queue"]["rule"] == "priority=0"
    # whole inputs, one per part (two do not fit 16 tokens), each part a tick of its own
    assert [chunk["tokens"] for chunk in timeline["prefill"]] == [10, 10]
    assert [chunk["tick"] for chunk in timeline["prefill"]] == [3, 4]
    assert timeline["finish"]["reason"] == FINISH_STOP
    high = core.timeline_of("high")
    assert high is not None and [c["tick"] for c in high["prefill"]] == [1, 2]


def test_inputs_that_cannot_run_end_with_an_error_at_once(core: EngineCore) -> None:
    core.embed(embed("long", [[1] * 65]))
    core.embed(embed("empty", [[1], []]))
    core.embed(embed("vocab", [[1, 10**6]]))
    core.embed(embed("none", []))
    ended = core.report().embedded
    assert [(e.request_id, e.finish_reason) for e in ended] == [
        ("long", FINISH_ERROR),
        ("empty", FINISH_ERROR),
        ("vocab", FINISH_ERROR),
        ("none", FINISH_ERROR),
    ]
    assert "65 tokens" in ended[0].detail and "--embedding-max-tokens" in ended[0].detail
    assert not core.has_work()


def test_a_full_queue_and_a_drain_refuse(core: EngineCore) -> None:
    for i in range(4):
        core.embed(embed(f"q{i}", [[1, 2]]))
    core.embed(embed("over", [[1, 2]]))
    (refused,) = core.report().embedded
    assert (refused.request_id, refused.finish_reason, refused.detail) == (
        "over",
        FINISH_REJECTED,
        REJECT_QUEUE_FULL,
    )
    core.drain()
    core.embed(embed("late", [[1, 2]]))
    (late,) = core.report().embedded
    assert (late.finish_reason, late.detail) == (FINISH_REJECTED, REJECT_DRAINING)
    # the queued ones still run to their end
    assert sorted(e.request_id for e in run_until_ended(core)) == ["q0", "q1", "q2", "q3"]


def test_cancels_end_each_request_once(core: EngineCore) -> None:
    core.embed(embed("a", [[1, 2]], frontend="f1"))
    core.embed(embed("b", [[1, 2]], frontend="f2"))
    core.embed(embed("c", [[1, 2]], frontend="f2"))
    assert core.cancel("a")
    assert not core.cancel("a")  # already ended
    assert core.cancel_frontend("f2") == 2
    ended = core.report().embedded
    assert [(e.request_id, e.finish_reason) for e in ended] == [
        ("a", FINISH_CANCELLED),
        ("b", FINISH_CANCELLED),
        ("c", FINISH_CANCELLED),
    ]
    assert not core.has_work()


def test_a_failed_batch_ends_its_requests_and_the_engine_goes_on(
    core: EngineCore, monkeypatch: pytest.MonkeyPatch
) -> None:
    core.embed(embed("doomed", [[1, 2, 3]]))
    real = embedder_module.EmbeddingContext.run

    def fail(self: embedder_module.EmbeddingContext, pieces: list[Piece]) -> list[np.ndarray]:
        raise RequestError("llama_decode returned -3 for an embedding batch")

    monkeypatch.setattr(embedder_module.EmbeddingContext, "run", fail)
    (failed,) = core.step().embedded
    assert (failed.finish_reason, failed.detail) == (
        FINISH_ERROR,
        "llama_decode returned -3 for an embedding batch",
    )
    monkeypatch.setattr(embedder_module.EmbeddingContext, "run", real)
    core.embed(embed("next", [[1, 2, 3]]))
    (ok,) = run_until_ended(core)
    assert ok.finish_reason == FINISH_STOP


def test_the_drain_timeout_ends_waiting_embeddings_with_an_error(core: EngineCore) -> None:
    core.embed(embed("a", [[1, 2]]))
    core.end_all("the engine stopped (drain timeout)")
    (ended,) = core.report().embedded
    assert (ended.finish_reason, ended.detail) == (
        FINISH_ERROR,
        "the engine stopped (drain timeout)",
    )
