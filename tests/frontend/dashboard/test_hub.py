"""The feed's fan-out: every viewer gets every update; a slow one is cut off, never waited for."""

from __future__ import annotations

import json
from typing import Any

from tinyserve import feed_protocol, protocol
from tinyserve.frontend.dashboard.hub import LEASE_S, FeedHub, Viewer, sse_frame


class Client:
    """What the hub uses of ``EngineClient``: its id, ``send`` and ``watch_feed``."""

    frontend_id = "f" * 32

    def __init__(self) -> None:
        self.sent: list[protocol.Message] = []
        self.on_feed: Any = None

    def send(self, message: protocol.Message) -> None:
        self.sent.append(message)

    def watch_feed(self, on_feed: Any) -> None:
        self.on_feed = on_feed


def update(seq: int) -> feed_protocol.FeedUpdate:
    return feed_protocol.FeedUpdate(seq, seq * 1_000_000, 0.1, seq, 1, {}, [None], [], {}, [])


def frames(viewer: Viewer) -> list[bytes | None]:
    out = []
    while not viewer.queue.empty():
        out.append(viewer.queue.get_nowait())
    return out


async def test_the_first_viewer_turns_the_feed_on_and_the_last_off() -> None:
    hub, client = FeedHub(), Client()
    a = hub.join(client)  # type: ignore[arg-type]
    b = hub.join(client)  # type: ignore[arg-type]
    assert client.on_feed == hub.publish
    assert [m.seconds for m in client.sent] == [LEASE_S]  # one; b's renewal is not due yet
    hub.leave(a)
    assert client.on_feed is not None
    hub.leave(b)
    assert client.on_feed is None
    assert client.sent[-1] == feed_protocol.FeedLease(client.frontend_id, 0.0)


async def test_a_slow_viewer_is_cut_off_and_the_others_get_everything() -> None:
    hub, client = FeedHub(queue_updates=4), Client()
    slow = hub.join(client)  # type: ignore[arg-type]
    fast = hub.join(client)  # type: ignore[arg-type]
    received: list[bytes | None] = []
    for seq in range(1, 11):
        hub.publish(update(seq))
        received += frames(fast)  # the fast viewer reads after each update
    assert len(received) == 10
    seqs = [json.loads(f.split(b"data: ")[1])["seq"] for f in received if f]
    assert seqs == list(range(1, 11))
    assert slow.cut and frames(slow) == [None]  # its backlog dropped: one "you are cut"
    hub.publish(update(11))
    assert frames(slow) == []  # nothing more is queued for it


def test_an_sse_frame_is_one_event_with_one_json_line() -> None:
    frame = sse_frame("update", {"a": "x\ny"})
    assert frame == b'event: update\ndata: {"a":"x\\ny"}\n\n'
