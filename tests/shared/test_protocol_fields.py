"""Field types are checked at decoding: a frame of the right shape with a wrong-typed field
is a ProtocolError, so a foreign sender cannot crash the engine or a frontend's listener."""

from __future__ import annotations

import copy
from typing import Any

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.shared.test_protocol import SAMPLES
from tinyserve import protocol as p

SUBMIT = next(m for m in SAMPLES if isinstance(m, p.Submit))
TICK = next(m for m in SAMPLES if isinstance(m, p.TickOutput))


def wire(message: p.Message) -> list[Any]:
    items: list[Any] = msgpack.unpackb(p.encode(message), raw=False)
    return items


def frame_with(message: p.Message, path: tuple[int, ...], value: Any) -> bytes:
    """``message``'s frame with the item at ``path`` (indices into the wire lists) replaced."""
    items = copy.deepcopy(wire(message))
    target = items
    for index in path[:-1]:
        target = target[index]
    target[path[-1]] = value
    return bytes(msgpack.packb(items, use_bin_type=True))


# Wire positions: [version, tag, *fields]; Submit: 2 request_id, 4 prompt_ids, 5 sampling,
# 6 max_tokens, 8 tenant; SamplingParams: 0 temperature, 4 stop; TickOutput: 3 updates;
# RequestUpdate: 1 seq, 3 text, 4 accepted.
WRONG = [
    (SUBMIT, (2,), 17),
    (SUBMIT, (4,), "1 2 3"),
    (SUBMIT, (4,), [1, "2"]),
    (SUBMIT, (4,), [1, True]),
    (SUBMIT, (5,), "greedy"),
    (SUBMIT, (5, 0), "hot"),
    (SUBMIT, (5, 4), "\n"),
    (SUBMIT, (6,), "16"),
    (SUBMIT, (6,), 16.0),
    (SUBMIT, (6,), None),
    (SUBMIT, (8,), ["team"]),
    (SUBMIT, (9,), {"ns": 1}),
    (TICK, (3,), 5),
    (TICK, (3,), {"r1": 1}),
    (TICK, (3, 0, 1), "0"),
    (TICK, (3, 0, 3), "text, not bytes"),
    (TICK, (3, 0, 4), "yes"),
    (TICK, (3, 0, 4), 1),
]


@pytest.mark.parametrize(("message", "path", "value"), WRONG)
def test_a_wrong_typed_field_is_a_protocol_error(
    message: p.Message, path: tuple[int, ...], value: Any
) -> None:
    with pytest.raises(p.ProtocolError):
        p.decode(frame_with(message, path, value))


@pytest.mark.parametrize("frame", [b"\x81\x80\x00", b"\x91\x81\x90\x01"])
def test_a_map_keyed_by_a_map_or_list_is_a_protocol_error(frame: bytes) -> None:
    # msgpack raises TypeError (unhashable key) for these, not one of its own errors.
    with pytest.raises(p.ProtocolError):
        p.decode(frame)


def test_whole_numbers_pass_where_floats_are_expected() -> None:
    decoded = p.decode(frame_with(SUBMIT, (5, 0), 1))
    assert isinstance(decoded, p.Submit) and decoded.sampling.temperature == 1


JUNK = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text()
    | st.binary(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8,
)


@given(st.sampled_from(SAMPLES), st.data())
def test_any_value_in_any_field_decodes_cleanly_or_is_a_protocol_error(
    message: p.Message, data: st.DataObject
) -> None:
    items = wire(message)
    index = data.draw(st.integers(2, len(items) - 1))
    frame = frame_with(message, (index,), data.draw(JUNK))
    try:
        decoded = p.decode(frame)
    except p.ProtocolError:
        return
    # Accepted only as a well-formed message (missing trailing fields take their defaults):
    # it encodes, and decodes back to itself.
    assert p.decode(p.encode(decoded)) == decoded
