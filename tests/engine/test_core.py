"""EngineCore driven in-process with the real model: no sockets, real llama.cpp."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable

import pytest

from tinyserve import protocol as p
from tinyserve.engine.core import EngineCore
from tinyserve.engine.output.report import Batch, Ended, Grant
from tinyserve.engine.runtime.runtime import LlamaRuntime, RuntimeSpec

from .conftest import core_config

FRONTEND = "f" * 32


class Driver:
    """Submits requests to a core, steps it, and collects every update per request."""

    def __init__(self, core: EngineCore) -> None:
        self.core = core
        self.updates: dict[str, list[p.RequestUpdate]] = defaultdict(list)
        self.batches: list[Batch] = []
        self.grants: list[Grant] = []
        self.finishes: dict[str, Ended] = {}  # by request id
        self._n = 0

    def submit(self, prompt_ids: list[int], max_tokens: int = 8, **sampling: object) -> str:
        self._n += 1
        rid = f"r{self._n}"
        self.core.submit(
            p.Submit(
                rid,
                FRONTEND,
                prompt_ids,
                p.SamplingParams(**sampling),
                max_tokens,
                arrival_ns=time.monotonic_ns(),
            )
        )
        return rid

    def step(self) -> None:
        report = self.core.step()
        if report.batch is not None:
            self.batches.append(report.batch)
        self.grants += report.grants
        for finish in report.finishes:
            self.finishes[finish.timeline.request.request_id] = finish
        for updates in report.updates.values():
            for update in updates:
                self.updates[update.request_id].append(update)

    def run(self, max_ticks: int = 500) -> None:
        for _ in range(max_ticks):
            self.step()
            if not self.core.has_work():
                return
        raise AssertionError("requests did not finish")

    def final(self, rid: str) -> p.RequestUpdate:
        finals = [u for u in self.updates[rid] if u.finish_reason is not None]
        assert len(finals) == 1, self.updates[rid]
        return finals[0]

    def tokens(self, rid: str) -> list[int]:
        return [t for u in self.updates[rid] for t in u.token_ids]

    def text(self, rid: str) -> bytes:
        return b"".join(u.text for u in self.updates[rid])


@pytest.fixture
def driver(runtime: LlamaRuntime) -> Driver:
    return Driver(EngineCore(core_config(), runtime))


PROMPT = list(range(100, 140))


def test_request_generates_exactly_max_tokens(driver: Driver) -> None:
    rid = driver.submit(PROMPT, max_tokens=12)
    driver.run()
    assert driver.final(rid).finish_reason == p.FINISH_LENGTH
    assert len(driver.tokens(rid)) == 12
    assert [u.seq for u in driver.updates[rid]] == list(range(len(driver.updates[rid])))


def test_concurrent_requests_share_batches(driver: Driver) -> None:
    rids = [driver.submit(PROMPT[i:], max_tokens=10) for i in range(4)]
    driver.run()
    assert all(driver.final(r).finish_reason == p.FINISH_LENGTH for r in rids)
    assert max(b.requests for b in driver.batches) == 4
    load = driver.core.load()
    assert (load.running, load.waiting, load.blocks_used) == (0, 0, 0)


def test_prefill_is_chunked_within_the_token_budget(driver: Driver) -> None:
    rid = driver.submit(list(range(200, 300)), max_tokens=2)  # 100 tokens, chunk 32
    driver.run()
    chunks = [chunk.tokens for chunk in driver.finishes[rid].timeline.chunks]
    assert chunks == [32, 32, 32, 4]
    assert max(b.tokens for b in driver.batches) <= 64
    # Each chunk's tick tells the frontend how far the prompt is (its progress events).
    done = [u.prompt_done for u in driver.updates[rid] if u.prompt_done]
    assert done == [32, 64, 96, 100]


def test_greedy_result_does_not_depend_on_batch_company(runtime: LlamaRuntime) -> None:
    alone = Driver(EngineCore(core_config(), runtime))
    a = alone.submit(PROMPT, max_tokens=10)
    alone.run()
    crowd = Driver(EngineCore(core_config(), runtime))
    b = crowd.submit(PROMPT, max_tokens=10)
    for i in range(3):
        crowd.submit(list(range(300 + i, 330 + i)), max_tokens=10)
    crowd.run()
    assert alone.tokens(a) == crowd.tokens(b)


def test_stop_string_ends_the_sequence_and_is_not_emitted(
    driver: Driver, tokenize: Callable[[str], list[int]]
) -> None:
    prompt = tokenize("Write a short list of three fruits:\n1.")
    rid = driver.submit(prompt, max_tokens=24)
    driver.run()
    full = driver.text(rid)
    words = full.split()
    assert len(words) >= 3, full
    stop = words[2].decode()
    again = driver.submit(prompt, max_tokens=24, stop=["@@never@@", stop])
    driver.run()
    assert driver.final(again).finish_reason == p.FINISH_STOP
    assert driver.text(again) == full[: full.find(stop.encode())]


def test_ignore_eos_runs_to_max_tokens_where_the_model_would_stop(
    driver: Driver, tokenize: Callable[[str], list[int]], runtime: LlamaRuntime
) -> None:
    prompt = tokenize("<|im_start|>user\nSay hi.<|im_end|>\n<|im_start|>assistant\n")
    natural = driver.submit(prompt, max_tokens=200)
    forced = driver.submit(prompt, max_tokens=200, ignore_eos=True)
    driver.run()
    assert driver.final(natural).finish_reason == p.FINISH_STOP  # a short reply, then EOG
    assert len(driver.tokens(natural)) < 200
    assert driver.final(forced).finish_reason == p.FINISH_LENGTH
    assert len(driver.tokens(forced)) == 200
    assert not any(runtime.is_eog(t) for t in driver.tokens(forced))


def test_character_split_across_tokens_arrives_whole_in_the_bytes(driver: Driver) -> None:
    # Measured: this prompt makes SmolLM2 repeat U+FF0D, whose 3 bytes span two tokens.
    rid = driver.submit(PROMPT, max_tokens=8)
    driver.run()
    pieces = [u.text for u in driver.updates[rid] if u.text]
    assert any(_incomplete_utf8(piece) for piece in pieces)
    assert b"".join(pieces).decode("utf-8") == "\uff0d" * 4


def _incomplete_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


@pytest.mark.parametrize(
    ("overrides", "prompt_len", "max_tokens", "reason"),
    [
        ({}, 1000, 100, p.REJECT_TOO_LONG),
        ({}, 500, 13, p.REJECT_TOO_LONG),  # one more than a slot's 512 cells hold
        ({}, 0, 4, p.REJECT_TOO_LONG),
        ({"max_queue": 1, "slots": 1}, 20, 4, p.REJECT_QUEUE_FULL),
    ],
)
def test_rejections(
    runtime: LlamaRuntime, overrides: dict[str, int], prompt_len: int, max_tokens: int, reason: str
) -> None:
    d = Driver(EngineCore(core_config(**overrides), runtime))
    if reason == p.REJECT_QUEUE_FULL:
        d.submit(PROMPT, 4)  # takes the free slot at the next tick: never queued
        d.submit(PROMPT, 4)  # waits: max_queue counts it
    rid = d.submit(list(range(1, prompt_len + 1)), max_tokens)
    d.step()
    final = d.final(rid)
    assert (final.finish_reason, final.detail) == (p.FINISH_REJECTED, reason)


def test_a_request_may_fill_its_slots_cells_and_no_more() -> None:
    """Each slot has cells of its own: the longest request is one slot's, not the context's
    (two slots of 256 cells here, the least llama.cpp gives a stream)."""
    config = core_config(slots=2, ctx_per_slot=256, chunk=256, max_batch_tokens=256)
    runtime = LlamaRuntime(RuntimeSpec.from_config(config))
    try:
        driver = Driver(EngineCore(config, runtime))
        assert driver.core.n_ctx == runtime.n_ctx_seq == 256
        ok = driver.submit(list(range(100, 350)), max_tokens=6)
        too_long = driver.submit(list(range(100, 350)), max_tokens=7)
        driver.run()
        assert driver.final(ok).finish_reason == p.FINISH_LENGTH
        assert len(driver.tokens(ok)) == 6
        final = driver.final(too_long)
        assert (final.finish_reason, final.detail) == (p.FINISH_REJECTED, p.REJECT_TOO_LONG)
    finally:
        runtime.close()


def test_load_counts_the_blocks_running_requests_fill_and_free_slots_keep(
    driver: Driver,
) -> None:
    core = driver.core
    assert core.load().blocks_total == 4 * 512 // 16
    first = driver.submit(PROMPT, max_tokens=2)
    driver.run()
    load = core.load()
    # Its 40 prompt tokens and its first token stay in slot 0 (the last one never went in).
    assert (load.running, load.waiting, load.blocks_used, load.blocks_cached) == (0, 0, 0, 3)
    again = driver.submit([*PROMPT, *driver.tokens(first), 7], max_tokens=8)  # to slot 0
    other = driver.submit(list(range(300, 350)), max_tokens=8)  # the lowest free: 1
    driver.step()
    assert [s.request_id if s else None for s in core.slots()] == [again, other, None, None]
    load = core.load()
    # again: 41 kept + 2 prefilled (3 blocks); other: nothing yet (a tick's pieces are of one
    # length, and its first piece, 32 of 50, is not again's 2)
    assert (load.running, load.blocks_used, load.blocks_cached) == (2, 3, 0)
    driver.step()
    load = core.load()
    # again: 3 blocks (its first token went in); other: a 32-token piece of 50 (2 blocks)
    assert (load.running, load.blocks_used, load.blocks_cached) == (2, 3 + 2, 0)
    core.cancel(other)
    driver.step()
    load = core.load()
    assert (load.running, load.blocks_used, load.blocks_cached) == (1, 3, 2)  # slot 1 keeps 32


def test_cancel_frees_slot_and_blocks_within_one_tick(driver: Driver) -> None:
    running = driver.submit(list(range(1, 100)), max_tokens=50)
    driver.step()  # now prefilling
    load = driver.core.load()
    assert (load.running, load.blocks_used) == (1, 2)  # a piece of 32
    assert [s.request_id if s else None for s in driver.core.slots()] == [running, *[None] * 3]
    driver.core.cancel(running)
    driver.step()
    assert driver.final(running).finish_reason == p.FINISH_CANCELLED
    load = driver.core.load()
    assert (load.running, load.blocks_used) == (0, 0) and not driver.core.has_work()
    assert driver.core.slots() == [None] * 4


def test_timeouts(runtime: LlamaRuntime) -> None:
    d = Driver(EngineCore(core_config(slots=1, queue_timeout=0.05, request_timeout=0.3), runtime))
    first = d.submit(PROMPT, max_tokens=400)
    second = d.submit(PROMPT, max_tokens=4)  # waits behind the first, which holds the slot
    d.run()
    assert d.final(second).finish_reason == p.FINISH_QUEUE_TIMEOUT
    assert d.final(first).finish_reason == p.FINISH_TIMEOUT
    assert d.core.load().blocks_used == 0 and not d.core.has_work()


def test_logprobs_are_a_distribution_and_rank_the_greedy_choice_first(driver: Driver) -> None:
    rid = driver.submit(PROMPT, max_tokens=4, logprobs=5)
    plain = driver.submit(PROMPT, max_tokens=4)
    driver.run()
    entries = [e for u in driver.updates[rid] for e in u.logprobs]
    assert len(entries) == len(driver.tokens(rid)) == 4
    assert not [e for u in driver.updates[plain] for e in u.logprobs]
    for token, (chosen, best) in zip(driver.tokens(rid), entries, strict=True):
        assert len(best) == 5
        assert best[0] == [token, chosen]  # greedy picks the most likely token
        assert [lp for _, lp in best] == sorted((lp for _, lp in best), reverse=True)
        assert chosen <= 0.0
