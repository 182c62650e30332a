"""The engine client's listener and dispatch: updates reach their streams, in order and all of
them, and acceptance is reported at once."""

from __future__ import annotations

from typing import Any

from aiohttp.test_utils import TestClient

from tests.frontend.harness import FakeEngine, until
from tinyserve import protocol
from tinyserve.config import Config
from tinyserve.frontend.link.engine_client import DRAIN_BATCH, EngineClient
from tinyserve.frontend.link.streams import RequestStream
from tinyserve.frontend.request.state import CLIENT

Client = TestClient[Any, Any]


def tick(client: EngineClient, *updates: protocol.RequestUpdate) -> None:
    client._dispatch(protocol.TickOutput(client.frontend_id, list(updates)))


def sent(client: EngineClient, request_id: str) -> None:
    """A request as ``submit`` leaves it (no engine here to send it to): pending."""
    client._streams[request_id] = RequestStream(request_id)


async def test_acceptance_reports_the_pending_change_once_per_tick(config: Config) -> None:
    client = EngineClient(config)
    calls: list[int] = []
    client.on_pending_change = lambda: calls.append(client.pending())
    try:
        for rid in ("a", "b"):
            sent(client, rid)
        assert client.pending() == 2
        tick(
            client,
            protocol.RequestUpdate("a", 0, accepted=True),
            protocol.RequestUpdate("b", 0, accepted=True),
        )
        assert calls == [0]  # both settled, one publish
        tick(client, protocol.RequestUpdate("a", 1, token_ids=[5], text=b"x"))
        assert calls == [0]  # nothing changed pending-wise: no publish
    finally:
        client.close()


class _Recorder:
    """A stream that records the seq of each update it gets; ``fail_at``: raises there."""

    pending = False

    def __init__(self, fail_at: int) -> None:
        self.seqs: list[int] = []
        self.fail_at = fail_at

    def deliver(self, update: protocol.RequestUpdate) -> None:
        self.seqs.append(update.seq)
        if update.seq == self.fail_at:
            raise RuntimeError("a bug while delivering")


async def test_a_burst_arrives_whole_and_a_failing_update_holds_nothing_up(
    served: Client, engine: FakeEngine
) -> None:
    # More messages than one wake-up of the listener takes: the rest come on its next turns,
    # with no new signal from the socket; the one whose delivery raises is logged and passed.
    client = served.app[CLIENT]
    recorder = _Recorder(fail_at=3)
    client._streams["r"] = recorder  # type: ignore[assignment]
    try:
        total = 3 * DRAIN_BATCH + 5
        for seq in range(total):
            out = protocol.TickOutput(client.frontend_id, [protocol.RequestUpdate("r", seq)])
            frames = [protocol.topic(client.frontend_id), protocol.encode(out)]
            await engine._pub.send_multipart(frames)
        await until(lambda: len(recorder.seqs) == total)
        assert recorder.seqs == list(range(total))
    finally:
        client.release("r")
