"""Every message survives a round trip; anything else is a ProtocolError, never a crash."""

from __future__ import annotations

import contextlib
import dataclasses

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tinyserve import feed_protocol as feed
from tinyserve import protocol as p

SAMPLES: list[p.Message] = [
    p.Hello("a" * 32, 123),
    p.Submit(
        "r1",
        "f" * 32,
        [1, 2, 3],
        p.SamplingParams(0.7, 0.9, 40, 7, ["\n\n", "é"]),
        16,
        priority=3,
        tenant="team-a",
        arrival_ns=99,
        trace_context={"traceparent": "00-x"},
    ),
    p.Submit("r2", "f" * 32, [4, 5], p.SamplingParams(), 0, prompt_logprobs=2, fork_of="r1"),
    p.Embed("r5", "f" * 32, [[1, 2, 3], [4]], arrival_ns=5),
    p.Embedded("f" * 32, "r5", p.FINISH_STOP, [b"\x00\x00\x80?" * 2, b"\x00" * 8], 4),
    p.Embedded("f" * 32, "r6", p.FINISH_REJECTED, detail=p.REJECT_QUEUE_FULL),
    p.Cancel("r1", "f" * 32, p.FINISH_CANCELLED),
    p.TimelineQuery("f" * 32, 7, "r1"),
    p.TimelineReply("f" * 32, 7, {"request_id": "r1", "prefill": [{"tick": 3, "tokens": 16}]}),
    p.TimelineReply("f" * 32, 8, None),
    feed.FeedLease("f" * 32, 3.0),
    p.HelloAck("f" * 32, 42, 7, "smol", 4096, 49152, 8, 16, 256, 64, -1, 576),
    p.TickOutput(
        "f" * 32,
        [
            p.RequestUpdate("r1", 0, [5, 6], b"\xc3", accepted=True),
            p.RequestUpdate("r2", 4, finish_reason=p.FINISH_LENGTH, prompt_tokens=9),
            p.RequestUpdate("r3", 0, prompt_logprobs=[[-0.5, [[7, -0.25]]], [-1.5, []]]),
            p.RequestUpdate("r4", 2, prompt_done=64, cached_tokens=16),
        ],
    ),
]


# Messages without a frontend id (published on a topic every frontend may read).
BROADCAST: list[p.Message] = [
    feed.FeedUpdate(
        7,
        123_456,
        0.1,
        40,
        3,
        {"requests": 4, "tokens": 70, "prefill_tokens": 64, "decode_tokens": 6, "decode_s": 0.2},
        [{"request_id": "r1", "tenant": "a", "phase": "prefill", "n_past": 16}, None],
        [{"tenant": "a", "priority": 0, "count": 2}],
        {"total": 256, "used": 30, "cached": 4},
        [{"kind": "grant", "request_id": "r1", "rule": "arrival", "wait_s": 0.25}],
    ),
]


@pytest.mark.parametrize("message", SAMPLES + BROADCAST, ids=lambda m: type(m).__name__)
def test_round_trip(message: p.Message) -> None:
    assert p.decode(p.encode(message)) == message


def test_the_feed_topic_prefixes_no_frontend_topic() -> None:
    # SUB matches by prefix: a frontend without viewers must not receive the feed.
    assert not p.topic("f" * 32).startswith(feed.FEED_TOPIC)
    assert not feed.FEED_TOPIC.startswith(p.topic("f" * 32))
    assert feed.FEED_TOPIC[:1] not in b"0123456789abcdef"  # frontend ids are hex


def test_a_feed_update_with_a_wrong_typed_slot_is_rejected() -> None:
    items = msgpack.unpackb(p.encode(BROADCAST[0]), raw=False)
    items[8] = ["not a dict or None"]  # slots
    with pytest.raises(p.ProtocolError, match="slots"):
        p.decode(msgpack.packb(items, use_bin_type=True))


def test_a_frame_without_trailing_defaulted_fields_still_decodes() -> None:
    # A sender that predates Submit.admission (and the fields after it) sends fewer items.
    submit = p.Submit("r1", "f" * 32, [1, 2], p.SamplingParams(), 4, admission={"a": 1})
    names = [f.name for f in dataclasses.fields(p.Submit)]
    items = [p.PROTOCOL_VERSION, p.Submit.TAG, *submit.to_wire()[: names.index("admission")]]
    decoded = p.decode(msgpack.packb(items, use_bin_type=True))
    assert isinstance(decoded, p.Submit)
    assert decoded.admission == {} and decoded.prompt_ids == [1, 2]
    # Missing a field without a default is still an error.
    short = [p.PROTOCOL_VERSION, p.Submit.TAG, *submit.to_wire()[:3]]
    with pytest.raises(p.ProtocolError):
        p.decode(msgpack.packb(short, use_bin_type=True))


def test_an_update_from_an_engine_without_prompt_progress_decodes() -> None:
    # RequestUpdate.prompt_done and stop_string came last, with defaults: an engine that
    # never sets them sends two items fewer, and its updates read as "no news".
    update = p.RequestUpdate("r1", 3, [5], b"x", prompt_done=40, stop_string="END")
    items = [p.PROTOCOL_VERSION, p.TickOutput.TAG, "f" * 32, [update.to_wire()[:-2]]]
    decoded = p.decode(msgpack.packb(items, use_bin_type=True))
    assert isinstance(decoded, p.TickOutput)
    assert decoded.updates == [p.RequestUpdate("r1", 3, [5], b"x")]


def test_version_2_carries_only_what_a_receiver_reads() -> None:
    # v2 dropped TickOutput.stats, Submit.want_timeline and the lifecycle events (a frontend
    # acts only on acceptance; the rest is in the final update's timeline).
    def names(cls: type[p.Message]) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    assert p.PROTOCOL_VERSION >= 2  # 3 added the feed's messages, no field of these
    assert names(p.TickOutput) == ["frontend_id", "updates"]
    assert "want_timeline" not in names(p.Submit)
    assert "events" not in names(p.RequestUpdate) and "accepted" in names(p.RequestUpdate)
    v1 = msgpack.packb([1, p.TickOutput.TAG, "f" * 32, [], [0, 0, 0, 0.0, 0, 0, 1, 0]])
    with pytest.raises(p.ProtocolError, match="version"):
        p.decode(v1)


def test_wrong_version_is_rejected() -> None:
    frame = msgpack.packb([p.PROTOCOL_VERSION + 1, p.Hello.TAG, "x", 1])
    with pytest.raises(p.ProtocolError, match="version"):
        p.decode(frame)


@pytest.mark.parametrize(
    "frame",
    [
        b"",
        b"\xc1",
        msgpack.packb({"a": 1}),
        msgpack.packb([p.PROTOCOL_VERSION]),
        msgpack.packb([p.PROTOCOL_VERSION, 99, 1]),
        msgpack.packb([p.PROTOCOL_VERSION, p.Hello.TAG, "only-one-field"]),
        msgpack.packb(
            [
                p.PROTOCOL_VERSION,
                p.Submit.TAG,
                "r",
                "f",
                [1],
                "not-sampling",
                1,
                0,
                "t",
                0,
                {},
                False,
            ]
        ),
    ],
)
def test_malformed_frames_raise_protocol_error(frame: bytes) -> None:
    with pytest.raises(p.ProtocolError):
        p.decode(frame)


@given(st.binary(max_size=64))
def test_random_bytes_never_escape_as_other_errors(frame: bytes) -> None:
    with contextlib.suppress(p.ProtocolError):
        p.decode(frame)


@pytest.mark.parametrize("message", SAMPLES, ids=lambda m: type(m).__name__)
def test_a_frontend_id_that_is_no_topic_is_rejected(message: p.Message) -> None:
    # Before this check a Hello with such an id reached topic() and killed the engine loop.
    frame = p.encode(dataclasses.replace(message, frontend_id="é" * 32))  # type: ignore[call-arg]
    with pytest.raises(p.ProtocolError, match="frontend_id"):
        p.decode(frame)


def test_topics_of_distinct_ids_do_not_prefix_each_other() -> None:
    a, b = p.topic("0" * 32), p.topic("0" * 31 + "1")
    assert not a.startswith(b) and not b.startswith(a)
