"""Child-process bodies for the board tests (run under the "spawn" start method).

Kept apart from the test module so a child imports only the board, not pytest's plugins.
"""

from __future__ import annotations

import os
from typing import Any

from tinyserve_native.board import Board, BoardError


def report_and_claim(path: str, queue: Any) -> None:
    """Attach, report what the engine published, then claim a slot and count requests in it."""
    with Board.attach(path) as board:
        queue.put((board.snapshot(), board.heartbeat_ns()))
        index = board.claim_slot("child", os.getpid(), 1)
        board.update_slot(index, 2, 3)
        queue.put(index)


def claim_until_full(path: str, barrier: Any, rounds: int, queue: Any) -> None:
    """Race a rival ``rounds`` times: claim slots until none is left, report, release them."""
    pid = os.getpid()
    with Board.attach(path) as board:
        for race in range(rounds):
            claimed: list[int] = []
            barrier.wait()
            while True:
                try:
                    claimed.append(board.claim_slot(f"p{pid}", pid, race))
                except BoardError:
                    break
            queue.put((race, pid, claimed))
            barrier.wait()  # both done: the board is full
            if race < rounds - 1:
                for index in claimed:
                    board.release_slot(index, pid)


def churn_one_slot(path: str, barrier: Any, rounds: int, queue: Any) -> None:
    """Claim, mark, check and release a board's only slot; count times it wasn't ours alone."""
    pid, conflicts, owned = os.getpid(), 0, 0
    with Board.attach(path) as board:
        barrier.wait()
        while owned < rounds:
            try:
                index = board.claim_slot("churn", pid, 0)
            except BoardError:
                continue  # the rival holds it
            owned += 1
            board.update_slot(index, pid, owned)  # the heartbeat field marks the owner
            seen = board.frontend_slots()
            mine = [(s.pid, s.heartbeat_ns, s.pending_requests) for s in seen]
            if mine != [(pid, pid, owned)]:
                conflicts += 1
            if not board.release_slot(index, pid):
                conflicts += 1
    queue.put(conflicts)


def publish_counter(path: str, barrier: Any, stop: Any) -> None:
    """Publish stats groups whose every field equals a counter, until ``stop`` is set."""
    k = 0
    with Board.attach(path) as board:
        barrier.wait()
        while k % 256 or not stop.is_set():
            k += 1
            board.publish(
                state=k,
                running=k,
                waiting=k,
                blocks_total=k,
                blocks_used=k,
                blocks_cached=k,
                drain_rate=float(k),
                ticks=k,
            )
