"""The engine's embeddings: vectors, batching across ticks beside generation, and the one
``Embedded`` every request gets however it ends."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import pytest

from tinyserve.engine import embedder as embedder_module
from tinyserve.engine.core import EngineCore
from tinyserve.engine.embedder import EMBED_SEQS
from tinyserve.engine.runtime import LlamaRuntime
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


def test_a_long_list_runs_one_batch_per_tick_beside_generation(
    core: EngineCore, tokenize: Callable[[str], list[int]]
) -> None:
    one = tokenize(TEXTS[0])  # 10 tokens: 6 fit a batch of 64, 3 a prompt chunk of 32
    alone, beside = min(64 // len(one), EMBED_SEQS), 32 // len(one)
    inputs = [one] * (beside * 8 + alone * 2)
    core.submit(Submit("gen", "fe", tokenize("Count to ten:"), SamplingParams(), max_tokens=8))
    core.embed(embed("many", inputs))
    batches, tokens_per_tick, ended = [], [], []
    while core.has_work():
        generating = bool(core.scheduler.by_id)
        report = core.step()
        if report.embed_batch is not None:
            batches.append((generating, report.embed_batch.inputs))
        tokens_per_tick.append(report.generated)
        ended += report.embedded
    # beside the running request a batch holds a prompt chunk's tokens; alone, a full batch
    # beside the generation request a batch holds a prompt chunk's tokens; alone, a full one
    assert batches == [(True, beside)] * 8 + [(False, alone)] * 2
    # the generation went on while the list was embedded: a token on each of those ticks
    # after its prefill (the first tick)
    assert tokens_per_tick[:8] == [1] * 8
    (done,) = ended
    assert done.finish_reason == FINISH_STOP and len(done.vectors) == len(inputs)
    first = vectors(done)[0]
    # the same input in batches of other sizes: the same vector, up to the last bits
    assert all(float(v @ first) > 1 - 1e-5 for v in vectors(done))


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

    def fail(self: embedder_module.EmbeddingContext, inputs: list[list[int]]) -> list[np.ndarray]:
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
