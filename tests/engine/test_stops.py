"""Stop strings are cut from the output and never leak, even split across tokens."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from tinyserve.engine.request.stops import StopMatcher


def run(stops: list[str], pieces: list[bytes]) -> tuple[bytes, bool]:
    matcher = StopMatcher(stops)
    out = b""
    for piece in pieces:
        out += matcher.feed(piece)
        if matcher.stopped:
            return out, True
    return out + matcher.flush(), False


def test_no_stops_passes_everything_through() -> None:
    assert run([], [b"a", b"b"]) == (b"ab", False)


def test_stop_split_across_pieces_is_cut() -> None:
    assert run(["END"], [b"hello E", b"N", b"D more"]) == (b"hello ", True)


def test_partial_match_is_released_when_it_fails() -> None:
    matcher = StopMatcher(["END"])
    assert matcher.feed(b"xE") == b"x"  # "E" might start "END"
    assert matcher.feed(b"x") == b"Ex"


def test_earliest_of_several_stops_wins() -> None:
    assert run(["bb", "a"], [b"xxbba"]) == (b"xx", True)


def test_the_stop_that_matched_is_named_as_the_request_gave_it() -> None:
    matcher = StopMatcher(["else", " Anything"])
    assert matcher.feed(b"Sunny. Any") == b"Sunny."  # " Any" may yet be " Anything"
    assert matcher.matched is None
    matcher.feed(b"thing else")
    assert matcher.matched == " Anything"  # both are there; it starts first
    multibyte = StopMatcher(["é"])
    multibyte.feed("café".encode())
    assert multibyte.matched == "é"


def test_multibyte_stop() -> None:
    assert run(["é"], [b"caf", b"\xc3", b"\xa9!"]) == (b"caf", True)


@given(
    text=st.text(alphabet="abcé\n", max_size=40),
    stop=st.text(alphabet="abcé\n", min_size=1, max_size=4),
    cuts=st.lists(st.integers(min_value=0, max_value=60), max_size=8),
)
def test_matches_a_plain_find_for_any_split(text: str, stop: str, cuts: list[int]) -> None:
    data = text.encode()
    bounds = sorted({0, len(data), *[c for c in cuts if c <= len(data)]})
    pieces = [data[a:b] for a, b in itertools.pairwise(bounds)]
    index = data.find(stop.encode())
    expected = (data[:index], True) if index >= 0 else (data, False)
    assert run([stop], pieces) == expected
