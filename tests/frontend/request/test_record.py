"""RequestRecord: one id, one arrival stamp, the output as the reply takes it, one TTFT."""

from __future__ import annotations

import time

from tinyserve import protocol
from tinyserve.frontend.models.usage import TokenCounts
from tinyserve.frontend.request.generation import Generation
from tinyserve.frontend.request.record import RequestRecord


def taken(text: bytes = b"", tokens: int = 0, **end: object) -> protocol.RequestUpdate:
    """An update as a reply takes it: ``tokens`` tokens, maybe the end."""
    return protocol.RequestUpdate("r", 0, list(range(tokens)), text, **end)  # type: ignore[arg-type]


def record() -> RequestRecord:
    return RequestRecord("/generate", Generation("hi", 4, protocol.SamplingParams(seed=3)))


def test_each_record_mints_its_own_id_and_stamps_its_arrival() -> None:
    before = time.monotonic_ns()
    first, second = record(), record()
    assert first.request_id != second.request_id and len(first.request_id) == 32
    assert before <= first.arrival_ns <= second.arrival_ns <= time.monotonic_ns()
    assert first.generation.sampling.seed == 3


def test_ttft_is_arrival_to_the_first_piece_with_tokens() -> None:
    rec = record()
    rec.take(taken())  # no tokens (a partial character): not the first token
    assert rec.ttft_ns is None and rec.generated == 0
    rec.take(taken(b"a", tokens=1))
    ttft = rec.ttft_ns
    assert ttft is not None and ttft == rec.first_token_ns - rec.arrival_ns > 0
    assert rec.token_gap_ns == 0
    rec.take(taken(b"bc", tokens=2))
    assert rec.ttft_ns == ttft  # later pieces leave it alone
    assert rec.token_gap_ns == rec.last_token_ns - rec.first_token_ns > 0
    assert rec.generated == 3


def test_finish_taken_by_the_reply_is_the_replied_finish() -> None:
    rec = record()
    rec.replied = True
    rec.take(taken(finish_reason=protocol.FINISH_LENGTH, prompt_tokens=2))
    assert rec.replied_finish is rec.finish and rec.finish is not None
    assert rec.finish.finish_reason == protocol.FINISH_LENGTH


def test_an_end_before_acceptance_is_the_outcome_but_no_replied_finish() -> None:
    rec = record()
    rec.finish = taken(finish_reason=protocol.FINISH_REJECTED, detail="queue_full")
    assert rec.replied_finish is None


def test_time_since_arrival_grows() -> None:
    rec = record()
    assert rec.ms_since_arrival(rec.arrival_ns + 1_500_000) == 1.5
    assert rec.ns_since_arrival() > 0


def test_prompt_length_is_the_engines_figure_else_our_own_count() -> None:
    rec = record()
    rec.prompt_tokens = 5
    assert rec.prompt_tokens_of(taken(finish_reason=protocol.FINISH_STOP, prompt_tokens=7)) == 7
    assert rec.prompt_tokens_of(taken(finish_reason=protocol.FINISH_ERROR, detail="made up")) == 5


def test_a_replys_counts_are_taken_once_for_every_surface() -> None:
    rec = record()
    rec.prompt_tokens = 5
    rec.take(protocol.RequestUpdate(rec.request_id, 0, token_ids=[1, 2, 3]))
    assert rec.counts() == TokenCounts(5, 3, 0)  # before the end: our count, nothing cached
    end = taken(finish_reason=protocol.FINISH_STOP, prompt_tokens=7, cached_tokens=4)
    assert rec.counts(end) == TokenCounts(7, 3, 4)
    # a call's choices: their tokens and cached tokens summed, its prompt once
    assert TokenCounts.summed([TokenCounts(7, 3, 4), TokenCounts(7, 2, 7)], 7) == (7, 5, 11)
