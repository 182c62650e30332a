"""The engine's time shared between embeddings and generation: a part only while embeddings
are owed time, and beside generation a part of about --embedding-part-decodes decodes' time,
never more than --embedding-tick-tokens tokens."""

from __future__ import annotations

from tinyserve.engine.embeddings.embed_share import MIN_PART, EmbedShare

MS = 1_000_000


def ticks_with_parts(share: EmbedShare, ticks: int, generation_ns: int, part_ns: int) -> str:
    """Which of ``ticks`` generation ticks ran a part ("E") or none ("."), each part taking
    ``part_ns``."""
    pattern = ""
    for _ in range(ticks):
        room = share.room(generating=True)
        pattern += "E" if room else "."
        share.ran(True, generation_ns, part_ns if room else 0, room)
    return pattern


def test_alone_a_part_is_a_whole_batch() -> None:
    share = EmbedShare(0.5, 16, 512)
    assert share.room(generating=False) == 512
    share.ran(False, 0, 900 * MS, 512)
    assert share.room(generating=True) == MIN_PART  # nothing owed, nothing measured beside


def test_parts_come_as_often_as_the_share_says() -> None:
    # a part takes 4 generation ticks' time: at a half share, one tick in four carries one
    # (4 ticks of 10 ms, one part of 40 ms)
    assert ticks_with_parts(EmbedShare(0.5, 16, 512), 12, 10 * MS, 40 * MS) == "E...E...E..."
    # at 0.8 a part is earned by each generation tick, but two ticks without one follow
    # each: a stream's median gap carries none
    assert ticks_with_parts(EmbedShare(0.8, 16, 512), 9, 10 * MS, 40 * MS) == "E..E..E.."
    # at 1 every tick runs a part, however long
    assert ticks_with_parts(EmbedShare(1.0, 16, 512), 4, 10 * MS, 400 * MS) == "EEEE"


def test_time_is_not_saved_up() -> None:
    share = EmbedShare(0.5, 16, 512)
    assert ticks_with_parts(share, 3, 10 * MS, 40 * MS) == "E.."  # owes 30 ms now
    share.idle()  # no embedding waits: the debt is forgiven, and nothing is earned
    assert ticks_with_parts(share, 6, 10 * MS, 30 * MS) == "E..E.."
    # ticks that earned more than parts spent keep one tick's earning at most
    share = EmbedShare(0.5, 16, 512)
    assert ticks_with_parts(share, 4, 100 * MS, 1 * MS) == "E..E"
    assert share.owed_ns == 100 * MS


def test_a_part_takes_about_the_decodes_it_may_take() -> None:
    # a decode takes 20 ms, an embedding token 5 ms: three decodes hold 12 tokens
    share = EmbedShare(0.9, 64, 512, part_decodes=3)
    share.ran(True, 20 * MS, 20 * MS, 4)
    assert share.part_tokens() == 12
    # embedding tokens grow dearer (10 ms each): the parts shrink with them, the averages
    # following the newest measurements, until a part is again three decodes long
    for _ in range(20):
        tokens = share.part_tokens()
        share.ran(True, 20 * MS, 10 * MS * tokens, tokens)
    assert share.part_tokens() == 6


def test_a_part_is_bounded_by_its_tokens_and_never_empty() -> None:
    share = EmbedShare(0.9, 8, 512, part_decodes=3)
    share.ran(True, 100 * MS, 1 * MS, 1)  # a cheap token: the time allows 300
    assert share.part_tokens() == 8
    share = EmbedShare(0.9, 64, 512, part_decodes=3)
    share.ran(True, 1 * MS, 100 * MS, 1)  # a dear one: the time allows none
    assert share.part_tokens() == MIN_PART


def test_a_part_never_exceeds_the_largest_input() -> None:
    assert EmbedShare(0.5, 1024, 512).room(generating=False) == 512
    assert EmbedShare(0.5, 1024, 512).tick_tokens == 512
