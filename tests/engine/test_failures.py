"""The first tier of failures, with the real model: a request that breaks inside the engine
ends alone, with an error, and the engine goes on serving the others; a prefix cache that
breaks is emptied, and the request it broke under goes on without it."""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Iterator
from typing import Any

import llama_cpp
import numpy as np
import pytest

from tinyserve import protocol as p
from tinyserve.engine.core import EngineCore
from tinyserve.engine.runtime import runtime as runtime_module
from tinyserve.engine.runtime.runtime import LlamaRuntime, RuntimeSpec
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


def cache_failures(caplog: pytest.LogCaptureFixture, step: str) -> list[logging.LogRecord]:
    message = f"prefix cache failed while {step}; it was emptied"
    return [r for r in caplog.records if r.getMessage() == message]


def request_id_of(record: logging.LogRecord) -> str:
    return str(record.fields["request_id"])  # type: ignore[attr-defined]


def assert_idle(core: EngineCore) -> None:
    load = core.load()
    assert not core.has_work() and (load.running, load.waiting, load.blocks_used) == (0, 0, 0)
    assert core.slots() == [None] * len(core.slots())
    assert not core.runner.samplers


def cold_tokens(
    runtime: LlamaRuntime, prompt: list[int], max_tokens: int, **sampling: object
) -> list[int]:
    """What ``prompt`` generates with no prefix cache, prefilled from scratch."""
    d = Driver(EngineCore(core_config(slots=1, prefix_cache=False), runtime))
    rid = d.submit(prompt, max_tokens=max_tokens, **sampling)
    d.run()
    return d.tokens(rid)


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
    # Its cells may be wrong: its slot (0) keeps none of them; the other's keeps its own.
    kept = driver.core.kv.kept.tokens
    assert kept[0] == [] and kept[1][: len(OTHER)] == OTHER
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


def test_a_failed_decode_ends_the_requests_in_its_batch_and_the_engine_goes_on(
    runtime: LlamaRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """llama_decode failing leaves the batch's KV undefined: the requests in it end with an
    error, their slots keep nothing, and one that was waiting runs as it would have."""
    expected = cold_tokens(runtime, OTHER, 4)
    # No speculation: its first guess times a decode of its own, which would be the second.
    settings = {"slots": 2, "prefix_cache": False, "speculate": "off"}
    d = Driver(EngineCore(core_config(**settings), runtime))
    real, calls = runtime.decode, {"n": 0}

    def decode() -> int:
        calls["n"] += 1
        return -3 if calls["n"] == 2 else real()

    monkeypatch.setattr(runtime, "decode", decode)
    first = d.submit(PROMPT, max_tokens=8)
    # as long as the first: a tick's prompt pieces are of one length
    second = d.submit(list(range(400, 400 + len(PROMPT))), max_tokens=8)
    waiting = d.submit(OTHER, max_tokens=4)  # no slot: not in the failed batch
    d.step()
    d.step()  # the failing decode
    for rid in (first, second):
        final = d.final(rid)
        assert (final.finish_reason, final.detail) == (p.FINISH_ERROR, "llama_decode returned -3")
    assert d.core.kv.kept.tokens[:2] == [[], []]
    d.run()
    assert d.final(waiting).finish_reason == p.FINISH_LENGTH
    assert d.tokens(waiting) == expected
    assert_idle(d.core)


def test_request_that_never_got_a_slot_reports_no_cached_tokens(runtime: LlamaRuntime) -> None:
    d = Driver(EngineCore(core_config(slots=1), runtime))
    d.submit(LONG, max_tokens=2)
    d.run()  # its blocks are cached now
    holder = d.submit(OTHER, max_tokens=200)
    waiting = d.submit(LONG, max_tokens=2)  # the cache holds its prompt's start
    d.step()
    assert d.core.scheduler.by_id[waiting].cache_hint == 96
    d.core.cancel(waiting)
    d.step()
    final = d.final(waiting)
    assert (final.finish_reason, final.cached_tokens) == (p.FINISH_CANCELLED, 0)
    d.core.cancel(holder)
    d.step()
    assert_idle(d.core)
    assert d.core.kv.cache is not None and d.core.kv.cache.blocks.used == 0  # nothing pinned


# -- the prefix cache ------------------------------------------------------------------------


def test_a_cache_broken_at_lookup_is_emptied_and_the_request_goes_on(
    driver: Driver, runtime: LlamaRuntime, caplog: pytest.LogCaptureFixture
) -> None:
    core = driver.core
    driver.submit(LONG, max_tokens=2)
    driver.submit(OTHER, max_tokens=30)
    driver.run()
    broken = core.kv.cache
    assert broken is not None and broken.tree.n_nodes > 6
    broken.from_disk = broken.from_disk[:0]  # its state broken behind its back
    bad = driver.submit([*OTHER, 1, 2], max_tokens=4, ignore_eos=True)  # to slot 1, kept there
    driver.run()
    final = driver.final(bad)
    # Only the cache failed: the request reused what its slot kept, and ran to its end.
    assert (final.finish_reason, final.detail) == (p.FINISH_LENGTH, "")
    assert final.cached_tokens == len(OTHER)
    assert not failures(caplog)
    assert [request_id_of(r) for r in cache_failures(caplog, "looking the prompt up")] == [bad]
    assert_idle(core)
    # A fresh cache, which holds only what finished since: bad's prompt.
    cache = core.kv.cache
    assert cache is not None and cache is not broken
    assert cache.peek(LONG) == 0 and cache.peek([*OTHER, 1, 2, 3]) == 32
    assert core.cache_stats is broken.stats  # the running totals go on


@pytest.fixture
def save_fails_once(
    driver: Driver, runtime: LlamaRuntime, monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    """The next ``llama_state_seq_get_data`` the runtime makes after ``driver``'s start-up
    fails (llama.cpp's seam)."""
    real = runtime.save_seq
    calls = {"n": 0}

    def save_seq(seq_id: int) -> Any:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("state_seq_get_data failed")
        return real(seq_id)

    monkeypatch.setattr(runtime, "save_seq", save_seq)
    yield
    assert calls["n"] >= 1


def test_a_cache_failure_while_storing_keeps_the_finish_and_the_slots_cells(
    driver: Driver, save_fails_once: None, caplog: pytest.LogCaptureFixture
) -> None:
    before = driver.core.kv.cache
    stored = driver.submit(LONG, max_tokens=4)
    driver.run()
    # It ran to the end and its client got every token: only caching it failed, which the
    # log says, not its finish.
    final = driver.final(stored)
    assert (final.finish_reason, final.detail) == (p.FINISH_LENGTH, "")
    assert len(driver.tokens(stored)) == 4
    assert not failures(caplog)
    assert [request_id_of(r) for r in cache_failures(caplog, "caching its prefix")] == [stored]
    cache = driver.core.kv.cache
    assert cache is not None and cache is not before  # emptied: a fresh one
    assert cache.tree.n_nodes == 0 and cache.blocks.free == cache.blocks.total
    assert_idle(driver.core)
    # The slot kept its cells: the same prompt again reuses them from there.
    again = driver.submit(LONG, max_tokens=2)
    driver.run()
    assert driver.final(again).cached_tokens == len(LONG) - 1
    assert driver.finishes[again].timeline.restore is None


def test_a_cache_failure_while_restoring_empties_it_and_the_request_prefills(
    runtime: LlamaRuntime, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    expected = cold_tokens(runtime, LONG, 6)
    d = Driver(EngineCore(core_config(slots=1), runtime))
    d.submit(LONG, max_tokens=2)
    d.run()  # its blocks are cached
    d.submit(OTHER, max_tokens=2)
    d.run()  # the one slot keeps OTHER now: LONG is in the cache alone

    def load_seq(seq_id: int, state: Any) -> bool:
        raise RuntimeError("state_seq_set_data failed")

    monkeypatch.setattr(runtime, "load_seq", load_seq)
    bad = d.submit(LONG, max_tokens=6)
    d.run()
    assert [request_id_of(r) for r in cache_failures(caplog, "restoring its prefix")] == [bad]
    final = d.final(bad)
    assert (final.finish_reason, final.cached_tokens) == (p.FINISH_LENGTH, 0)
    assert d.tokens(bad) == expected  # computed from scratch, as a cold run splits it
    assert not failures(caplog)
    assert_idle(d.core)
    assert d.core.kv.cache is not None and d.core.kv.cache.peek(LONG) == 96  # bad's, stored


def test_a_restore_llama_cpp_refuses_leaves_the_request_running(
    runtime: LlamaRuntime, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """llama.cpp drops the slot's cells before it reads a saved state, and keeps them dropped
    when it refuses one. The slot kept a 20-token start of the prompt; the cache held more,
    so the grant wrote it there, and llama.cpp refused the state."""
    shared, rest = list(range(2000, 2020)), list(range(2100, 2130))
    d = Driver(EngineCore(core_config(slots=1), runtime))
    d.submit(shared + rest, max_tokens=2)  # cached: 50 tokens
    d.run()
    d.submit([*shared, *OTHER], max_tokens=2)  # slot 0 keeps shared + OTHER
    d.run()
    real = runtime.load_seq
    assert d.core.kv.cache is not None
    cell_record = d.core.kv.cache.layout.cell_record

    def wrong_layer_count(seq_id: int, state: Any) -> bool:
        bad = state.copy()
        n_cells = int(bad[12:16].view(np.uint32)[0])
        at = 16 + n_cells * cell_record + 4  # v_trans, then n_layer
        bad[at : at + 4] = np.array([99], np.uint32).view(np.uint8)
        return real(seq_id, bad)

    monkeypatch.setattr(runtime, "load_seq", wrong_layer_count)
    prompt = [*shared, *rest, 5]
    rid = d.submit(prompt, max_tokens=4, ignore_eos=True)
    d.run()
    monkeypatch.setattr(runtime, "load_seq", real)
    final = d.final(rid)
    assert (final.finish_reason, final.detail) == (p.FINISH_LENGTH, "")
    # Its slot held positions 0..n-1 at the end (else its store would fail), and it
    # generated what a cold prefill does.
    assert not cache_failures(caplog, "caching its prefix")
    assert d.tokens(rid) == cold_tokens(runtime, prompt, 4, ignore_eos=True)


# -- pieces ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_buffer_runtime() -> Iterator[LlamaRuntime]:
    """A runtime whose piece buffer starts at 16 bytes (no token of the default model is over
    256 bytes: the longest is 81), so that real tokens take the path a long piece takes."""
    saved = runtime_module._PIECE_BUF
    runtime_module._PIECE_BUF = 16
    try:
        spec = RuntimeSpec(resolve_model_path(None), 1, 256, 16, 1)
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
