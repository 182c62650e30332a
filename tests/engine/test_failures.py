"""The first tier of failures, with the real model: a request that breaks inside the engine
ends alone, with an error, and the engine goes on serving the others."""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Iterator
from typing import Any

import llama_cpp
import pytest

from tinyserve import protocol as p
from tinyserve.engine import runtime as runtime_module
from tinyserve.engine.core import EngineCore
from tinyserve.engine.runtime import LlamaRuntime, RuntimeSpec
from tinyserve.errors import RequestError
from tinyserve.model import resolve_model_path

from .conftest import core_config
from .test_core import PROMPT, Driver

OTHER = list(range(300, 340))
LONG = list(range(1000, 1100))  # 100 tokens: six full blocks to cache


@pytest.fixture
def driver(runtime: LlamaRuntime) -> Driver:
    return Driver(EngineCore(core_config(), runtime))


def failures(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.getMessage().startswith("request failed")]


def request_id_of(record: logging.LogRecord) -> str:
    return str(record.fields["request_id"])  # type: ignore[attr-defined]


def assert_idle(core: EngineCore) -> None:
    assert not core.by_id and not core.running and not len(core.policy)
    assert core.blocks.used == 0 and all(s is None for s in core.slots)
    assert not core.samplers


def test_failure_while_sampling_ends_that_request_and_the_batch_goes_on(
    driver: Driver, runtime: LlamaRuntime, caplog: pytest.LogCaptureFixture
) -> None:
    # More alternatives than the vocabulary has: the engine cannot compute them (the frontend
    # never sends this, but the core must not die of it).
    bad = driver.submit(PROMPT, max_tokens=8, logprobs=runtime.n_vocab)
    good = driver.submit(OTHER, max_tokens=8)
    driver.run()
    final = driver.final(bad)
    assert (final.finish_reason, final.detail) == (
        p.FINISH_ERROR,
        f"logprobs={runtime.n_vocab}: the vocabulary has {runtime.n_vocab} tokens",
    )
    assert not driver.tokens(bad)
    assert driver.final(good).finish_reason == p.FINISH_LENGTH
    assert len(driver.tokens(good)) == 8
    assert [request_id_of(r) for r in failures(caplog)] == [bad]
    assert_idle(driver.core)
    after = driver.submit(PROMPT, max_tokens=4)  # the engine still serves
    driver.run()
    assert driver.final(after).finish_reason == p.FINISH_LENGTH


@pytest.fixture
def top_k_7_cannot_be_built(monkeypatch: pytest.MonkeyPatch) -> None:
    """llama.cpp returns no sampler (NULL) for top_k=7, as it does when it cannot make one."""
    real = llama_cpp.llama_sampler_init_top_k

    def init_top_k(k: int) -> Any:
        return None if k == 7 else real(k)

    monkeypatch.setattr(llama_cpp, "llama_sampler_init_top_k", init_top_k)


@pytest.mark.usefixtures("top_k_7_cannot_be_built")
def test_sampler_that_cannot_be_built_fails_its_request_at_the_slot_grant(
    runtime: LlamaRuntime, caplog: pytest.LogCaptureFixture
) -> None:
    d = Driver(EngineCore(core_config(slots=1), runtime))
    bad = d.submit(PROMPT, max_tokens=4, temperature=0.7, top_k=7)
    behind = d.submit(OTHER, max_tokens=4)  # waits for the one slot
    d.run()
    final = d.final(bad)
    assert (final.finish_reason, final.detail) == (
        p.FINISH_ERROR,
        "llama.cpp could not create a sampler stage",
    )
    assert d.updates[bad][0].accepted
    assert [g.request_id for g in d.grants] == [bad, behind]
    assert d.final(behind).finish_reason == p.FINISH_LENGTH  # it got the slot back
    assert [request_id_of(r) for r in failures(caplog)] == [bad]
    assert_idle(d.core)


def test_request_that_never_got_a_slot_reports_no_cached_tokens(runtime: LlamaRuntime) -> None:
    d = Driver(EngineCore(core_config(slots=1), runtime))
    d.submit(LONG, max_tokens=2)
    d.run()  # its blocks are cached now
    holder = d.submit(OTHER, max_tokens=200)
    waiting = d.submit(LONG, max_tokens=2)  # a hit, pinned while it waits
    d.step()
    pinned = d.core.blocks.used
    d.core.cancel(waiting)
    d.step()
    final = d.final(waiting)
    assert (final.finish_reason, final.cached_tokens) == (p.FINISH_CANCELLED, 0)
    assert d.core.blocks.used < pinned  # its pins were released
    d.core.cancel(holder)
    d.step()
    assert_idle(d.core)


# -- the prefix cache ------------------------------------------------------------------------


def cache_is_empty(core: EngineCore) -> bool:
    assert core.cache is not None
    return core.cache.tree.n_nodes == 0 and core.blocks.cached == 0


def test_cache_inconsistency_at_acceptance_fails_that_request_and_resets_the_cache(
    driver: Driver, caplog: pytest.LogCaptureFixture
) -> None:
    core = driver.core
    assert core.cache is not None
    driver.submit(LONG, max_tokens=2)
    driver.run()
    # Break the cache: its first block is freed behind its back, while the tree still has it.
    core.blocks.evict(core.cache.tree.match(LONG[:16]).block_ids[0])
    bad = driver.submit(LONG, max_tokens=4)
    good = driver.submit(OTHER, max_tokens=4)
    driver.run()
    final = driver.final(bad)
    assert (final.finish_reason, final.detail) == (
        p.FINISH_ERROR,
        "prefix cache failure (the cache was reset)",
    )
    assert driver.final(good).finish_reason == p.FINISH_LENGTH
    assert [request_id_of(r) for r in failures(caplog)] == [bad]
    assert any(r.getMessage().startswith("prefix cache reset") for r in caplog.records)
    assert_idle(core)
    # A fresh cache: the prompt is computed again, then served from the cache again.
    again = driver.submit(LONG, max_tokens=2)
    driver.run()
    assert driver.final(again).cached_tokens == 0
    hit = driver.submit(LONG, max_tokens=2)
    driver.run()
    assert driver.final(hit).cached_tokens == 96


@pytest.fixture
def share_fails_once(runtime: LlamaRuntime, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The next ``llama_memory_seq_cp`` the runtime makes fails (llama.cpp's seam)."""
    real = runtime.share
    calls = {"n": 0}

    def share(src: int, dst: int, start: int, end: int) -> None:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("seq_cp failed")
        real(src, dst, start, end)

    monkeypatch.setattr(runtime, "share", share)
    yield
    assert calls["n"] >= 1


def test_cache_failure_while_parking_keeps_the_finish_and_keeps_nothing(
    driver: Driver, share_fails_once: None, caplog: pytest.LogCaptureFixture
) -> None:
    parked = driver.submit(LONG, max_tokens=4)
    good = driver.submit(OTHER, max_tokens=30)
    driver.run()
    # It ran to the end and its client got every token: only caching it failed, which the
    # log says, not its finish.
    final = driver.final(parked)
    assert (final.finish_reason, final.detail) == (p.FINISH_LENGTH, "")
    assert len(driver.tokens(parked)) == 4
    assert driver.final(good).finish_reason == p.FINISH_LENGTH
    assert not failures(caplog)
    parking = [r for r in caplog.records if r.getMessage().startswith("caching a finished")]
    assert [request_id_of(r) for r in parking] == [parked]
    assert any(r.getMessage().startswith("prefix cache reset") for r in caplog.records)
    assert_idle(driver.core)
    # What the failed park half did is gone: no hit on the half-parked prompt.
    again = driver.submit(LONG, max_tokens=2)
    driver.run()
    assert driver.final(again).cached_tokens == 0


def test_a_failed_park_leaves_no_block_referenced(
    driver: Driver, runtime: LlamaRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    driver.submit(LONG, max_tokens=2)
    driver.run()
    real = runtime.share
    failed: list[int] = []

    def share(src: int, dst: int, start: int, end: int) -> None:
        if dst >= driver.core.config.slots and not failed:  # into a cache sequence: a park
            failed.append(dst)
            raise RuntimeError("seq_cp failed")
        real(src, dst, start, end)

    monkeypatch.setattr(runtime, "share", share)
    longer = driver.submit(LONG + list(range(2000, 2040)), max_tokens=2)  # extends the prefix
    driver.run()
    assert failed
    final = driver.final(longer)
    assert (final.finish_reason, final.cached_tokens) == (p.FINISH_LENGTH, 96)
    assert_idle(driver.core)
    assert driver.core.blocks.free == driver.core.blocks.total  # no pin of the park is left


def test_cache_failure_at_a_slot_grant_spares_the_waiting_hits(
    runtime: LlamaRuntime, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    reference = Driver(EngineCore(core_config(slots=1, prefix_cache=False), runtime))
    rid = reference.submit(LONG, max_tokens=6)
    reference.run()
    expected = reference.tokens(rid)
    d = Driver(EngineCore(core_config(slots=1), runtime))
    d.submit(LONG, max_tokens=2)
    d.run()
    real = runtime.share
    failed: list[int] = []

    def share(src: int, dst: int, start: int, end: int) -> None:
        if dst == 0 and not failed:  # the first attach to slot 0 (a park copies from it)
            failed.append(dst)
            raise RuntimeError("seq_cp failed")
        real(src, dst, start, end)

    monkeypatch.setattr(runtime, "share", share)
    bad = d.submit(LONG, max_tokens=6)  # gets the slot: its attach fails
    waiting = d.submit(LONG, max_tokens=6)  # waits with a hit whose cells the reset drops
    d.run()
    assert failed
    assert d.final(bad).finish_reason == p.FINISH_ERROR
    final = d.final(waiting)
    assert (final.finish_reason, final.cached_tokens) == (p.FINISH_LENGTH, 0)
    assert d.tokens(waiting) == expected  # computed again from scratch, not from lost cells
    assert [request_id_of(r) for r in failures(caplog)] == [bad]
    assert_idle(d.core)


# -- pieces ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_buffer_runtime() -> Iterator[LlamaRuntime]:
    """A runtime whose piece buffer starts at 16 bytes (no token of the default model is over
    256 bytes: the longest is 81), so that real tokens take the path a long piece takes."""
    saved = runtime_module._PIECE_BUF
    runtime_module._PIECE_BUF = 16
    try:
        spec = RuntimeSpec(resolve_model_path(None), 256, 1, 16, 1)
        rt = LlamaRuntime(spec)
    finally:
        runtime_module._PIECE_BUF = saved
    yield rt
    rt.close()


def test_a_piece_longer_than_the_buffer_comes_out_whole(
    small_buffer_runtime: LlamaRuntime, runtime: LlamaRuntime
) -> None:
    longer = 0
    for token in range(runtime.n_vocab):
        piece = small_buffer_runtime.piece(token)
        assert piece == runtime.piece(token), token
        longer += len(piece) > 16
    assert longer > 100
    assert max(len(small_buffer_runtime.piece(t)) for t in (46778, 45855)) == 81
    assert ctypes.sizeof(small_buffer_runtime._piece) >= 81


def test_a_token_outside_the_vocabulary_is_a_request_error(runtime: LlamaRuntime) -> None:
    # llama.cpp itself would throw a C++ exception, which would end the process.
    with pytest.raises(RequestError, match="outside the vocabulary"):
        runtime.piece(runtime.n_vocab)
    with pytest.raises(RequestError):
        runtime.piece(-1)
