"""The scheduler's decisions (``engine/scheduling/scheduler.py``), through ``EngineCore`` over the
model-free ``FakeRuntime``: which rows a tick's batch holds and in what order, and when
requests expire."""

from __future__ import annotations

from collections.abc import Iterator
from itertools import groupby

import pytest

from tests.engine.fake_runtime import FakeRuntime
from tinyserve import protocol as p
from tinyserve.config import build_config
from tinyserve.engine.core import EngineCore
from tinyserve.engine.output.report import Cause, TickReport

FRONTEND = "f" * 32
S = 1_000_000_000  # ns


class Engine:
    """A core on a fake runtime with a clock the test moves: 4 slots of 64 cells, chunks of
    6 tokens, 12 tokens a batch."""

    def __init__(self, **overrides: object) -> None:
        settings = {"ctx_per_slot": 64, "slots": 4, "chunk": 6, "max_batch_tokens": 12}
        settings |= {"block_size": 4, "host_cache_mb": 0, "threads": 1, "speculate": "off"}
        settings |= overrides
        config = build_config(settings, environ={})
        self.runtime = FakeRuntime(64, config.slots, config.max_batch_tokens)
        self.now = 0
        self.core = EngineCore(config, self.runtime, clock=lambda: self.now)  # type: ignore[arg-type]

    def submit(self, rid: str, prompt: list[int], max_tokens: int = 40) -> str:
        sampling = p.SamplingParams(ignore_eos=True)
        self.core.submit(p.Submit(rid, FRONTEND, prompt, sampling, max_tokens, arrival_ns=0))
        return rid

    def step(self) -> list[tuple[int, int, bool]]:
        """One tick; the batch it decoded as runs of (slot, rows, last row has logits)."""
        self.core.step()
        rows = self.runtime._rows()
        runs = [list(run) for _, run in groupby(rows, key=lambda row: row[2])]
        return [(run[0][2], len(run), run[-1][3]) for run in runs]

    def slot_of(self, rid: str) -> int:
        [slot] = [i for i, s in enumerate(self.core.slots()) if s and s.request_id == rid]
        return slot


@pytest.fixture
def engine() -> Iterator[Engine]:
    e = Engine()
    yield e
    e.runtime.close()


def test_decode_rows_first_then_prompt_pieces_of_one_length_within_the_budget_in_slot_order(
    engine: Engine,
) -> None:
    engine.submit("a", [1, 2, 3])
    engine.submit("b", [2, 2, 3])
    assert engine.step() == [(0, 3, True), (1, 3, True)]  # both prompts, a token each
    engine.core.cancel("a")  # slot 0 frees up (keeping a's cells); b (slot 1) decodes on
    engine.submit("c", [3, 2, 1])  # next to b, a slot that keeps nothing: 2
    engine.submit("d", list(range(1, 21)))  # 20 tokens: next to b and c, 3
    engine.submit("e", list(range(2, 22)))  # the one left, 0
    # In grant order: b's token, then c's whole prompt (sampled); d's and e's first pieces (6
    # of 20) are not of c's length and wait.
    assert engine.step() == [(1, 1, True), (2, 3, True)]
    assert [engine.slot_of(r) for r in "bcde"] == [1, 2, 3, 0]
    # Two tokens and d's piece: e's piece of 6 would not fit the budget (12) beside them, and
    # is not cut to the 4 rows left, which would be a piece of another length. The rows go to
    # llama.cpp in slot order.
    for _ in range(3):
        assert engine.step() == [(1, 1, True), (2, 1, True), (3, 6, False)]
    assert engine.step() == [(1, 1, True), (2, 1, True), (3, 2, True)]  # d's last, sampled
    assert engine.step() == [(0, 6, False), (1, 1, True), (2, 1, True), (3, 1, True)]


def test_a_piece_of_another_length_waits_and_the_budget_cuts_the_first() -> None:
    engine = Engine(policy="fifo")
    engine.submit("long", list(range(1, 31)), max_tokens=4)  # 30 tokens: five pieces of 6
    engine.submit("short", [3, 2, 1, 4], max_tokens=4)  # 4 tokens, granted second
    assert engine.step() == [(0, 6, False)]  # the short prompt's 4 are not the long one's 6
    for _ in range(4):
        assert engine.step()[0] == (0, 6, engine.core.slots()[0].prefill_left == 0)
    assert engine.step() == [(0, 1, True), (1, 4, True)]
    engine.runtime.close()
    # Eleven decoding sequences leave a budget of 12 one row: a piece is cut to what fits.
    crowded = Engine(slots=12, max_batch_tokens=12)
    for n in range(11):
        crowded.submit(f"r{n}", [n + 1, 2, 3])
    for _ in range(11):
        crowded.step()
    assert all(s and s.prefill_left == 0 for s in crowded.core.slots()[:11])
    crowded.submit("late", list(range(1, 11)), max_tokens=4)
    assert crowded.step()[-1] == (11, 1, False)
    crowded.runtime.close()


def finishes(report: TickReport) -> list[tuple[str, str, Cause]]:
    return [(f.timeline.request.request_id, f.reason, f.cause) for f in report.finishes]


def test_a_request_expires_waiting_or_running_by_its_own_clock() -> None:
    engine = Engine(slots=1, queue_timeout=1.0, request_timeout=5.0)
    engine.submit("running", [1, 2, 3])
    engine.step()
    engine.submit("waiting", [3, 2, 1])  # no slot: the one is taken
    engine.now = 1 * S
    assert not finishes(engine.core.step())  # not past its queue timeout yet
    engine.now = 1 * S + 1
    report = engine.core.step()
    assert finishes(report) == [("waiting", p.FINISH_QUEUE_TIMEOUT, Cause.QUEUE_TIMEOUT)]
    assert report.finishes[0].timeline.slot is None  # it never got one
    engine.now = 5 * S + 1
    report = engine.core.step()
    assert finishes(report) == [("running", p.FINISH_TIMEOUT, Cause.REQUEST_TIMEOUT)]
    assert report.finishes[0].timeline.finish.generated == 3  # type: ignore[union-attr]
    assert not engine.core.has_work() and engine.core.slots() == [None]
    engine.runtime.close()
