"""Board: layout, errors and slot protocol in-process, then across real processes."""

from __future__ import annotations

import multiprocessing
import os
import stat
import struct
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tinyserve_native.board import (
    FRONTEND_ID_MAX,
    HEADER_SIZE,
    LAYOUT_VERSION,
    SLOT_SIZE,
    Board,
    BoardError,
)

from . import board_workers

SPAWN = multiprocessing.get_context("spawn")
STATS = dict(
    state=1,
    running=3,
    waiting=2,
    blocks_total=1000,
    blocks_used=600,
    blocks_cached=100,
    drain_rate=2.5,
    ticks=2**40,
    embed_waiting=5,
)


@pytest.fixture
def path(tmp_path: Path) -> str:
    return str(tmp_path / "board")


@pytest.fixture
def engine(path: str) -> Iterator[Board]:
    board = Board.create(path, frontend_slots=4)
    yield board
    board.close()
    board.unlink()


def _patch(path: str, offset: int, fmt: str, value: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(struct.pack(fmt, value))


def test_create_writes_a_private_zeroed_board(engine: Board, path: str) -> None:
    st = os.stat(path)
    assert stat.S_IMODE(st.st_mode) == 0o600
    assert st.st_size == HEADER_SIZE + 4 * SLOT_SIZE == 128 + 4 * 64
    with open(path, "rb") as f:
        assert f.read(8) == b"TSBOARD1"
    assert engine.snapshot() == (0,) * 9 + (0.0, 0, 0)
    assert engine.frontend_slots() == []
    assert engine.n_frontend_slots == 4
    assert os.listdir(os.path.dirname(path)) == ["board"]  # no temp file left behind


def test_fields_sit_at_their_documented_offsets(engine: Board, path: str) -> None:
    engine.set_identity(4242, 11)
    engine.heartbeat(12)
    engine.publish(**STATS)
    index = engine.claim_slot("fe-π", 77, 13)
    engine.update_slot(index, 14, 6)
    raw = Path(path).read_bytes()
    assert struct.unpack_from("<QIIqQQQ", raw, 0) == (
        int.from_bytes(b"TSBOARD1", "little"),
        LAYOUT_VERSION,
        4,
        4242,
        11,
        12,
        4,
    )
    assert struct.unpack_from("<6IdQI", raw, 48) == (1, 3, 2, 1000, 600, 100, 2.5, 2**40, 5)
    slot = HEADER_SIZE + index * SLOT_SIZE
    assert struct.unpack_from("<qQI32s", raw, slot) == (
        77,
        14,
        6,
        "fe-π".encode().ljust(32, b"\0"),
    )


def test_publish_and_identity_read_back_as_one_snapshot(engine: Board) -> None:
    engine.set_identity(4242, 11)
    engine.heartbeat(99)
    engine.publish(**STATS)
    snap = engine.snapshot()
    assert snap._asdict() == {"pid": 4242, "started_ns": 11, "heartbeat_ns": 99, **STATS}
    assert engine.heartbeat_ns() == 99


def test_slots_are_claimed_in_order_until_none_is_left(engine: Board) -> None:
    assert [engine.claim_slot(f"fe-{i}", 100 + i, i) for i in range(4)] == [0, 1, 2, 3]
    with pytest.raises(BoardError):
        engine.claim_slot("fe-4", 104, 0)
    assert engine.release_slot(2, 999) is False  # not its owner
    assert engine.release_slot(2, 102) is True
    assert engine.release_slot(2, 102) is False
    assert engine.claim_slot("fe-5", 105, 0) == 2
    assert [(s.index, s.pid, s.frontend_id) for s in engine.frontend_slots()] == [
        (0, 100, "fe-0"),
        (1, 101, "fe-1"),
        (2, 105, "fe-5"),
        (3, 103, "fe-3"),
    ]


def test_pending_requests_count_only_slots_in_use(engine: Board) -> None:
    a = engine.claim_slot("a", 1, 0)
    b = engine.claim_slot("b", 2, 0)
    engine.update_slot(a, 5, 10)
    engine.update_slot(b, 5, 2**32 - 1)
    assert engine.pending_requests() == 2**32 + 9  # summed wider than a slot's u32
    engine.release_slot(b, 2)
    assert engine.pending_requests() == 10
    c = engine.claim_slot("c", 3, 0)
    assert c == b
    assert engine.frontend_slots()[1][1:] == (3, 0, 0, "c")  # nothing left by "b"


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda b: b.claim_slot("x" * (FRONTEND_ID_MAX + 1), 1, 0), ValueError),
        (lambda b: b.claim_slot("x", 0, 0), ValueError),
        (lambda b: b.update_slot(0, 0, 0), BoardError),  # not claimed
        (lambda b: b.update_slot(4, 0, 0), IndexError),
        (lambda b: b.release_slot(-1, 1), IndexError),
        (lambda b: b.publish(**{**STATS, "running": -1}), OverflowError),
    ],
)
def test_bad_slot_and_stats_calls_raise(
    engine: Board, call: Callable[[Board], Any], error: type[Exception]
) -> None:
    with pytest.raises(error):
        call(engine)


def test_a_closed_board_refuses_every_call(path: str) -> None:
    board = Board.create(path, frontend_slots=1)
    board.close()
    board.close()
    for call in (board.snapshot, board.heartbeat_ns, board.frontend_slots, board.pending_requests):
        with pytest.raises(BoardError):
            call()
    with pytest.raises(BoardError):
        board.claim_slot("x", 1, 0)
    board.unlink()
    board.unlink()
    assert not os.path.exists(path)


def test_boards_come_only_from_create_or_attach() -> None:
    with pytest.raises(TypeError):
        Board()


def test_create_replaces_an_old_board_and_unlink_spares_the_new_one(path: str) -> None:
    old = Board.create(path, frontend_slots=2)
    frontend = Board.attach(path)
    new = Board.create(path, frontend_slots=3)
    new.publish(**STATS)
    assert frontend.snapshot().ticks == 0  # still maps the old, now unlinked, file
    old.unlink()  # the file at `path` is new's: left alone
    with Board.attach(path) as again:
        assert (again.n_frontend_slots, again.snapshot().ticks) == (3, STATS["ticks"])
    new.unlink()
    assert not os.path.exists(path)
    for board in (old, frontend, new):
        board.close()


def test_attach_rejects_missing_and_malformed_files(path: str) -> None:
    with pytest.raises(BoardError, match="no board"):
        Board.attach(path)
    Path(path).write_bytes(b"short")
    with pytest.raises(BoardError, match="too small"):
        Board.attach(path)
    Path(path).write_bytes(bytes(HEADER_SIZE + SLOT_SIZE))
    with pytest.raises(BoardError, match="not a board"):
        Board.attach(path)
    Board.create(path, frontend_slots=2).close()
    _patch(path, 8, "<I", LAYOUT_VERSION + 1)
    with pytest.raises(BoardError, match="version"):
        Board.attach(path)
    Board.create(path, frontend_slots=2).close()
    _patch(path, 12, "<I", 3)  # claims more slots than the file holds
    with pytest.raises(BoardError, match="truncated"):
        Board.attach(path)


def test_a_seqlock_left_odd_fails_readers_and_writers(engine: Board, path: str) -> None:
    _patch(path, 40, "<Q", 7)  # as if the engine died mid-write
    with pytest.raises(BoardError, match="mid-write"):
        engine.snapshot()
    with pytest.raises(BoardError):
        engine.publish(**STATS)


def _spawn(target: Callable[..., None], *args: Any) -> Any:
    proc = SPAWN.Process(target=target, args=args)
    proc.start()
    return proc


def _join(*procs: Any) -> None:
    for proc in procs:
        proc.join(timeout=30)
        assert proc.exitcode == 0


def test_writes_cross_processes_both_ways(engine: Board, path: str) -> None:
    engine.set_identity(os.getpid(), 5)
    engine.heartbeat(6)
    engine.publish(**STATS)
    queue = SPAWN.Queue()
    child = _spawn(board_workers.report_and_claim, path, queue)
    snap, heartbeat = queue.get(timeout=30)
    index = queue.get(timeout=30)
    _join(child)
    assert (snap.pid, snap.started_ns, snap.ticks, heartbeat) == (os.getpid(), 5, 2**40, 6)
    assert engine.frontend_slots() == [(index, child.pid, 2, 3, "child")]
    assert engine.release_slot(index, child.pid)  # the engine reclaims a dead frontend's slot
    assert engine.pending_requests() == 0


def test_racing_claims_never_share_a_slot(path: str) -> None:
    n_slots, rounds = 4096, 3  # many slots, so that the two claim loops overlap
    with Board.create(path, frontend_slots=n_slots) as board:
        queue, barrier = SPAWN.Queue(), SPAWN.Barrier(2)
        procs = [_spawn(board_workers.claim_until_full, path, barrier, rounds, queue) for _ in "ab"]
        results = [queue.get(timeout=30) for _ in range(2 * rounds)]
        _join(*procs)
        owners = {s.index: s.pid for s in board.frontend_slots()}
    for race in range(rounds):
        claims = [indices for r, _, indices in results if r == race]
        assert sorted(claims[0] + claims[1]) == list(range(n_slots)), f"race {race}"
    last = {pid: indices for r, pid, indices in results if r == rounds - 1}
    assert owners == {i: pid for pid, indices in last.items() for i in indices}


def test_two_processes_churning_one_slot_never_both_own_it(path: str) -> None:
    with Board.create(path, frontend_slots=1) as board:
        queue, barrier = SPAWN.Queue(), SPAWN.Barrier(2)
        procs = [_spawn(board_workers.churn_one_slot, path, barrier, 5000, queue) for _ in "ab"]
        conflicts = [queue.get(timeout=60), queue.get(timeout=60)]
        _join(*procs)
        assert conflicts == [0, 0]
        assert board.frontend_slots() == []


def test_seqlock_snapshots_are_never_torn(path: str) -> None:
    with Board.create(path, frontend_slots=1) as board:
        barrier, stop = SPAWN.Barrier(2), SPAWN.Event()
        writer = _spawn(board_workers.publish_counter, path, barrier, stop)
        barrier.wait()
        seen: set[int] = set()
        # Read until many distinct groups went by, so the check is a real race even on a
        # loaded machine; the deadline only bounds a starved run.
        deadline = time.monotonic() + 10
        while len(seen) < 200 and time.monotonic() < deadline:
            snap = board.snapshot()
            k = snap.ticks
            assert snap[3:9] == (k,) * 6 and snap.drain_rate == float(k), snap
            seen.add(k)
        stop.set()
        _join(writer)
    assert len(seen) >= 200, f"only {len(seen)} groups observed: no real race"
