"""EngineCore driven in-process with the real model: no sockets, real llama.cpp."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable

import pytest

from tinyserve import protocol as p
from tinyserve.engine.core import EngineCore
from tinyserve.engine.report import Batch, Finish, Grant
from tinyserve.engine.runtime import LlamaRuntime

from .conftest import core_config

FRONTEND = "f" * 32


class Driver:
    """Submits requests to a core, steps it, and collects every update per request."""

    def __init__(self, core: EngineCore) -> None:
        self.core = core
        self.updates: dict[str, list[p.RequestUpdate]] = defaultdict(list)
        self.batches: list[Batch] = []
        self.grants: list[Grant] = []
        self.finishes: dict[str, Finish] = {}  # by request id
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
    assert driver.core.blocks.used == 0 and not driver.core.running


def test_prefill_is_chunked_within_the_token_budget(driver: Driver) -> None:
    rid = driver.submit(list(range(200, 300)), max_tokens=2)  # 100 tokens, chunk 32
    driver.run()
    chunks = [chunk.tokens for chunk in driver.finishes[rid].timeline.chunks]
    assert chunks == [32, 32, 32, 4]
    assert max(b.tokens for b in driver.batches) <= 64


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


def test_a_request_short_of_kv_blocks_waits_for_them_and_keeps_its_place(driver: Driver) -> None:
    total = driver.core.blocks.total * 16
    big = driver.submit(list(range(1, 200)), max_tokens=total - 200 - 16)
    late = driver.submit(list(range(1, 30)), max_tokens=8)
    small = driver.submit(list(range(1, 5)), max_tokens=2)  # would fit, but comes after late
    driver.step()
    assert driver.updates[big][0].accepted and driver.updates[late][0].accepted
    assert driver.core.blocks.free < driver.core.blocks.blocks_for(29 + 8)
    assert [s.request_id for s in driver.core.blocked] == [late, small]
    assert driver.core.load().waiting == 2
    driver.core.cancel(big)
    driver.run()
    assert driver.final(late).finish_reason == p.FINISH_LENGTH
    assert driver.final(small).finish_reason == p.FINISH_LENGTH
    timeline = driver.final(late).timeline
    assert timeline is not None
    assert timeline["accepted"]["kv_wait_ms"] > 0
    # Accepted when its blocks freed up, granted a slot no earlier.
    assert timeline["slot"]["ms"] >= timeline["accepted"]["ms"]
    assert timeline["queue"]["wait_ms"] >= 0
    # The grant carries that wait for blocks to the metrics; a request that found them free
    # waited none.
    kv_waits = {g.request_id: g.kv_wait_s for g in driver.grants}
    assert kv_waits[late] * 1e3 == pytest.approx(timeline["accepted"]["kv_wait_ms"], abs=1e-3)
    assert kv_waits[big] == 0.0
    assert driver.core.blocks.used == 0 and not driver.core.blocked


def test_a_full_queue_of_requests_short_of_blocks_is_kv_cache_full(runtime: LlamaRuntime) -> None:
    d = Driver(EngineCore(core_config(max_queue=1), runtime))
    total = d.core.blocks.total * 16
    d.submit(list(range(1, 200)), max_tokens=total - 200 - 16)
    d.submit(list(range(1, 30)), max_tokens=8)  # waits for blocks: the queue's one place
    rid = d.submit(list(range(1, 30)), max_tokens=8)
    d.step()
    assert (d.final(rid).finish_reason, d.final(rid).detail) == (
        p.FINISH_REJECTED,
        p.REJECT_KV_CACHE_FULL,
    )


def test_cancel_frees_slot_and_blocks_within_one_tick(driver: Driver) -> None:
    running = driver.submit(list(range(1, 100)), max_tokens=50)
    driver.step()  # now prefilling
    assert driver.core.blocks.used > 0 and len(driver.core.running) == 1
    driver.core.cancel(running)
    driver.step()
    assert driver.final(running).finish_reason == p.FINISH_CANCELLED
    assert driver.core.blocks.used == 0 and not driver.core.running
    assert all(s is None for s in driver.core.slots)


def test_timeouts(runtime: LlamaRuntime) -> None:
    d = Driver(EngineCore(core_config(slots=1, queue_timeout=0.05, request_timeout=0.3), runtime))
    first = d.submit(PROMPT, max_tokens=500)
    second = d.submit(PROMPT, max_tokens=4)  # waits behind the first, which holds the slot
    d.run()
    assert d.final(second).finish_reason == p.FINISH_QUEUE_TIMEOUT
    assert d.final(first).finish_reason == p.FINISH_TIMEOUT
    assert d.core.blocks.used == 0


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
