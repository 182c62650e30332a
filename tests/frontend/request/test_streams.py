"""Request streams: ordering, gap detection, incremental UTF-8, exactly one finish."""

from __future__ import annotations

import asyncio

import pytest

from tinyserve import protocol
from tinyserve.frontend.request.streams import Finish, Piece, RequestStream


def update(seq: int, text: bytes = b"", **kwargs: object) -> protocol.RequestUpdate:
    tokens = kwargs.pop("token_ids", [seq] if text else [])
    return protocol.RequestUpdate("r1", seq, token_ids=tokens, text=text, **kwargs)  # type: ignore[arg-type]


async def drain(stream: RequestStream) -> list[Piece]:
    return [piece async for piece in stream.pieces()]


def joined(pieces: list[Piece]) -> str:
    return "".join(p.text for p in pieces)


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
    assert sum(p.tokens for p in pieces) == 2
    finish = pieces[-1].finish
    assert finish == Finish(protocol.FINISH_STOP, prompt_tokens=5)
    # Delivered before anyone read: merged into one piece.
    assert len(pieces) == 1 and pieces[0].token_ids == [1, 2]
    assert stream.engine_finished


async def test_rejection_is_an_early_finish() -> None:
    stream = RequestStream("r1")
    stream.deliver(
        update(0, finish_reason=protocol.FINISH_REJECTED, detail=protocol.REJECT_QUEUE_FULL)
    )
    early = await stream.acknowledged()
    assert early is not None
    assert (early.reason, early.detail) == (protocol.FINISH_REJECTED, "queue_full")
    assert not stream.accepted and stream.engine_finished


async def test_accepted_and_finished_in_one_update_is_not_early() -> None:
    stream = RequestStream("r1")
    stream.deliver(update(0, b"x", accepted=True, finish_reason=protocol.FINISH_LENGTH))
    assert await stream.acknowledged() is None
    pieces = await drain(stream)
    assert joined(pieces) == "x"
    assert pieces[-1].finish is not None and pieces[-1].finish.reason == "length"


async def test_gap_ends_the_stream_with_an_error() -> None:
    stream = RequestStream("r1")
    stream.deliver(update(0, accepted=True))
    stream.deliver(update(1, b"a"))
    stream.deliver(update(3, b"c"))  # 2 went missing
    stream.deliver(update(4, b"d", finish_reason=protocol.FINISH_STOP))  # ignored afterwards
    pieces = await asyncio.wait_for(drain(stream), timeout=1)
    assert joined(pieces) == "a"
    finish = pieces[-1].finish
    assert finish is not None and finish.reason == protocol.FINISH_ERROR
    assert "update 2 missing" in finish.detail and not finish.engine_down
    assert not stream.engine_finished  # the engine still holds it: the handler must cancel
    assert [p.finish is not None for p in pieces].count(True) == 1


async def test_gap_before_acceptance_is_early() -> None:
    stream = RequestStream("r1")
    stream.deliver(update(1, accepted=True))
    early = await asyncio.wait_for(stream.acknowledged(), timeout=1)
    assert early is not None and early.reason == protocol.FINISH_ERROR


async def test_fail_marks_engine_down_once() -> None:
    stream = RequestStream("r1")
    stream.deliver(update(0, accepted=True))
    stream.fail("engine unavailable: heartbeat", engine_down=True)
    stream.fail("again", engine_down=True)
    stream.deliver(update(1, b"late"))
    pieces = await asyncio.wait_for(drain(stream), timeout=1)
    assert [p.finish for p in pieces if p.finish] == [
        Finish(protocol.FINISH_ERROR, "engine unavailable: heartbeat", engine_down=True)
    ]
    assert joined(pieces) == ""


async def test_fail_wakes_a_waiter_for_acceptance() -> None:
    stream = RequestStream("r1")
    waiter = asyncio.ensure_future(stream.acknowledged())
    await asyncio.sleep(0)
    stream.fail("engine gone", engine_down=True)
    early = await asyncio.wait_for(waiter, timeout=1)
    assert early is not None and early.engine_down


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
    # Only complete characters come out: no piece holds half of one.
    assert all(p.text == "" or p.text in text for p in pieces)


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


async def test_a_reader_keeping_up_gets_one_piece_per_update() -> None:
    stream = RequestStream("r1")
    stream.deliver(update(0, accepted=True))
    pieces = stream.pieces()
    first = await anext(pieces)
    assert (first.text, first.tokens, first.finish) == ("", 0, None)
    stream.deliver(update(1, b"a"))
    assert (await anext(pieces)).text == "a"
    stream.deliver(update(2, b"b", finish_reason=protocol.FINISH_STOP))
    last = await anext(pieces)
    assert last.text == "b" and last.finish is not None


async def test_a_slow_reader_gets_merged_pieces_and_the_queue_stays_bounded() -> None:
    stream = RequestStream("r1")
    stream.deliver(update(0, accepted=True))
    logprob = [-0.5, [[7, -0.5]]]
    for seq in range(1, 10_001):
        stream.deliver(update(seq, b"x", token_ids=[seq], logprobs=[logprob]))
        assert stream.queued == 1
    stream.fail("engine gone", engine_down=True)
    assert stream.queued == 2
    pieces = await drain(stream)
    assert len(pieces) == 2  # every update merged into one piece, then the failure
    assert pieces[0].text == "x" * 10_000 and pieces[0].tokens == 10_000
    assert pieces[0].token_ids == list(range(1, 10_001)) and len(pieces[0].logprobs) == 10_000
    assert pieces[1].finish is not None and pieces[1].finish.engine_down
