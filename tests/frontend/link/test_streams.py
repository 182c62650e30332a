"""Request streams: ordering, gap detection, whole characters, exactly one finish."""

from __future__ import annotations

import asyncio

import pytest

from tinyserve import protocol
from tinyserve.frontend.link.streams import ENGINE_LOST, RequestStream, text_of


def update(seq: int, text: bytes = b"", **kwargs: object) -> protocol.RequestUpdate:
    tokens = kwargs.pop("token_ids", [seq] if text else [])
    return protocol.RequestUpdate("r1", seq, token_ids=tokens, text=text, **kwargs)  # type: ignore[arg-type]


async def drain(stream: RequestStream) -> list[protocol.RequestUpdate]:
    """Every update up to and including the one that carries the finish."""
    taken = []
    while not taken or taken[-1].finish_reason is None:
        update = await stream.next()
        assert update is not None
        taken.append(update)
    return taken


def joined(updates: list[protocol.RequestUpdate]) -> str:
    return "".join(text_of(u) for u in updates)


def finish_of(update: protocol.RequestUpdate) -> tuple[object, ...]:
    """How an update ends its request."""
    u = update
    return (u.finish_reason, u.detail, u.prompt_tokens, u.cached_tokens, u.timeline)


async def test_accepted_then_tokens_then_finish() -> None:
    stream = RequestStream("r1")
    assert stream.pending
    stream.deliver(update(0, accepted=True))
    assert await stream.acknowledged() is None
    assert not stream.pending and stream.accepted
    stream.deliver(update(1, b"Hel"))
    stream.deliver(update(2, b"lo", finish_reason=protocol.FINISH_STOP, prompt_tokens=5))
    pieces = await drain(stream)
    assert joined(pieces) == "Hello"
    assert sum(len(p.token_ids) for p in pieces) == 2
    assert finish_of(pieces[-1]) == (protocol.FINISH_STOP, "", 5, 0, None)
    # Delivered before anyone read: merged into one update.
    assert len(pieces) == 1 and pieces[0].token_ids == [1, 2]
    assert stream.engine_finished


async def test_rejection_is_an_early_finish() -> None:
    stream = RequestStream("r1")
    stream.deliver(
        update(0, finish_reason=protocol.FINISH_REJECTED, detail=protocol.REJECT_QUEUE_FULL)
    )
    early = await stream.acknowledged()
    assert early is not None
    assert (early.finish_reason, early.detail) == (protocol.FINISH_REJECTED, "queue_full")
    assert not stream.accepted and stream.engine_finished


async def test_accepted_and_finished_in_one_update_is_not_early() -> None:
    stream = RequestStream("r1")
    stream.deliver(update(0, b"x", accepted=True, finish_reason=protocol.FINISH_LENGTH))
    assert await stream.acknowledged() is None
    pieces = await drain(stream)
    assert joined(pieces) == "x"
    assert pieces[-1].finish_reason == "length"


async def test_gap_ends_the_stream_with_an_error() -> None:
    stream = RequestStream("r1")
    stream.deliver(update(0, accepted=True))
    stream.deliver(update(1, b"a"))
    stream.deliver(update(3, b"c"))  # 2 went missing
    stream.deliver(update(4, b"d", finish_reason=protocol.FINISH_STOP))  # ignored afterwards
    pieces = await asyncio.wait_for(drain(stream), timeout=1)
    assert joined(pieces) == "a"
    finish = pieces[-1]
    assert finish.finish_reason == protocol.FINISH_ERROR  # not ENGINE_LOST
    assert "update 2 missing" in finish.detail
    assert not stream.engine_finished  # the engine still holds it: the handler must cancel
    assert [p.finish_reason is not None for p in pieces].count(True) == 1


async def test_gap_before_acceptance_is_early() -> None:
    stream = RequestStream("r1")
    stream.deliver(update(1, accepted=True))
    early = await asyncio.wait_for(stream.acknowledged(), timeout=1)
    assert early is not None and early.finish_reason == protocol.FINISH_ERROR


async def test_fail_marks_engine_down_once() -> None:
    stream = RequestStream("r1")
    stream.deliver(update(0, accepted=True))
    stream.fail("engine unavailable: heartbeat", lost=True)
    stream.fail("again", lost=True)
    stream.deliver(update(1, b"late"))
    pieces = await asyncio.wait_for(drain(stream), timeout=1)
    assert [finish_of(p) for p in pieces if p.finish_reason] == [
        (ENGINE_LOST, "engine unavailable: heartbeat", 0, 0, None)
    ]
    assert joined(pieces) == ""


async def test_fail_wakes_a_waiter_for_acceptance() -> None:
    stream = RequestStream("r1")
    waiter = asyncio.ensure_future(stream.acknowledged())
    await asyncio.sleep(0)
    stream.fail("engine gone", lost=True)
    early = await asyncio.wait_for(waiter, timeout=1)
    assert early is not None and early.finish_reason == ENGINE_LOST


@pytest.mark.parametrize("text", ["é", "€", "😀", "a😀b€c"])
async def test_character_split_byte_by_byte_comes_out_whole(text: str) -> None:
    stream = RequestStream("r1")
    stream.deliver(update(0, accepted=True))
    data = text.encode()
    for i, byte in enumerate(data):
        last = i == len(data) - 1
        stream.deliver(
            update(i + 1, bytes([byte]), finish_reason=protocol.FINISH_STOP if last else None)
        )
    pieces = await drain(stream)
    assert joined(pieces) == text
    assert "\ufffd" not in joined(pieces)
    # Only complete characters come out: no update holds half of one.
    assert all(text_of(p) == "" or text_of(p) in text for p in pieces)


async def test_incomplete_tail_is_dropped_not_replaced() -> None:
    stream = RequestStream("r1")
    stream.deliver(update(0, b"ok" + "😀".encode()[:2], accepted=True))
    stream.deliver(update(1, finish_reason=protocol.FINISH_LENGTH))
    assert joined(await drain(stream)) == "ok"


async def test_final_update_text_is_decoded() -> None:
    stream = RequestStream("r1")
    stream.deliver(update(0, b"caf", accepted=True))
    stream.deliver(update(1, "é!".encode(), finish_reason=protocol.FINISH_STOP))
    assert joined(await drain(stream)) == "café!"


async def test_invalid_utf8_becomes_replacement_character() -> None:
    stream = RequestStream("r1")
    stream.deliver(update(0, b"a\xffb", accepted=True, finish_reason=protocol.FINISH_STOP))
    assert joined(await drain(stream)) == "a\ufffdb"


async def test_tokens_without_accepted_event_count_as_accepted() -> None:
    stream = RequestStream("r1")
    stream.deliver(update(0, b"hi"))
    assert await stream.acknowledged() is None and stream.accepted


async def test_a_reader_keeping_up_gets_each_update_as_it_came() -> None:
    stream = RequestStream("r1")
    stream.deliver(update(0, accepted=True))
    first = await stream.next()
    assert first is not None
    assert (text_of(first), len(first.token_ids), first.finish_reason) == ("", 0, None)
    stream.deliver(update(1, b"a"))
    second = await stream.next()
    assert second is not None and text_of(second) == "a"
    stream.deliver(update(2, b"b", finish_reason=protocol.FINISH_STOP))
    last = await stream.next()
    assert last is not None and text_of(last) == "b" and last.finish_reason is not None


async def test_a_slow_reader_gets_merged_updates_and_the_queue_stays_bounded() -> None:
    stream = RequestStream("r1")
    stream.deliver(update(0, accepted=True))
    logprob = [-0.5, [[7, -0.5]]]
    for seq in range(1, 10_001):
        stream.deliver(update(seq, b"x", token_ids=[seq], logprobs=[logprob]))
        assert stream.queued == 1
    stream.fail("engine gone", lost=True)
    assert stream.queued == 2
    pieces = await drain(stream)
    assert len(pieces) == 2  # every update merged into one, then the failure
    assert text_of(pieces[0]) == "x" * 10_000 and len(pieces[0].token_ids) == 10_000
    assert pieces[0].token_ids == list(range(1, 10_001)) and len(pieces[0].logprobs) == 10_000
    assert pieces[1].finish_reason == ENGINE_LOST
