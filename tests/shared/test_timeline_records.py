"""The timeline's steps as records: their wire forms, and the readers that share them."""

from __future__ import annotations

from typing import Any, get_type_hints

import pytest

from tinyserve.frontend.native.native_bodies import RequestTimeline
from tinyserve.timeline_records import (
    Accepted,
    AcceptedWire,
    ChunkWire,
    DecodeRun,
    Finished,
    FinishWire,
    PrefillChunk,
    SlotGrant,
    SlotWire,
    TimelineWire,
    slot_ms,
)

ARRIVAL = 5_000_000


@pytest.mark.parametrize(
    ("record", "wire_type"),
    [
        (Accepted(1, ARRIVAL + 1_500_000, 0, 1), AcceptedWire),
        (SlotGrant(2, ARRIVAL + 2_000_000, 1, "arrival", 0), SlotWire),
        (PrefillChunk(2, 16, ARRIVAL + 3_000_000, 1_000_000, 900_000), ChunkWire),
        (Finished("stop", "", 9, ARRIVAL + 9_000_000, 7), FinishWire),
    ],
)
def test_each_step_writes_exactly_its_wire_keys(record: Any, wire_type: type) -> None:
    assert list(record.wire(ARRIVAL)) == list(get_type_hints(wire_type))


def test_stamps_become_ms_since_arrival_and_chunks_run_from_the_previous_step() -> None:
    chunk = PrefillChunk(2, 16, ARRIVAL + 3_000_000, 1_000_000, 900_000)
    assert chunk.start_ns == ARRIVAL + 2_000_000
    assert chunk.wire(ARRIVAL) == {
        "tick": 2,
        "tokens": 16,
        "ms": 1.0,
        "end_ms": 3.0,
        "decode_ms": 0.9,
    }


def test_decode_runs_grow_only_with_consecutive_ticks_of_one_batch_size() -> None:
    run = DecodeRun(10, 1, 2, 1_000_000)
    assert run.follows(11, 2) and not run.follows(12, 2) and not run.follows(11, 3)
    assert run.plus(500_000) == DecodeRun(10, 2, 2, 1_500_000)
    assert run.plus(500_000).wire() == [10, 2, 2, 1.5]


@pytest.mark.parametrize(
    ("timeline", "expected"),
    [(None, None), ({}, None), ({"slot": None}, None), ({"slot": {"ms": 12.5}}, 12.5)],
)
def test_slot_ms_reads_the_wire_form(timeline: dict[str, Any] | None, expected: Any) -> None:
    assert slot_ms(timeline) == expected


def test_the_frontend_reply_model_names_the_same_fields() -> None:
    assert list(RequestTimeline.model_fields) == list(get_type_hints(TimelineWire))
