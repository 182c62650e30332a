"""The engine client's dispatch: updates reach their streams, acceptance is reported at once."""

from __future__ import annotations

from tinyserve import protocol
from tinyserve.config import Config
from tinyserve.frontend.link.engine_client import EngineClient
from tinyserve.frontend.request.streams import RequestStream


def tick(client: EngineClient, *updates: protocol.RequestUpdate) -> None:
    client._dispatch(protocol.TickOutput(client.frontend_id, list(updates)))


def sent(client: EngineClient, request_id: str) -> None:
    """A request as ``submit`` leaves it (no engine here to send it to): pending, 3 blocks."""
    client._streams[request_id] = RequestStream(request_id, 3)


async def test_acceptance_reports_the_pending_change_once_per_tick(config: Config) -> None:
    client = EngineClient(config)
    calls: list[tuple[int, int]] = []
    client.on_pending_change = lambda: calls.append(client.pending())
    try:
        for rid in ("a", "b"):
            sent(client, rid)
        assert client.pending() == (6, 2)
        tick(
            client,
            protocol.RequestUpdate("a", 0, accepted=True),
            protocol.RequestUpdate("b", 0, accepted=True),
        )
        assert calls == [(0, 0)]  # both settled, one publish
        tick(client, protocol.RequestUpdate("a", 1, token_ids=[5], text=b"x"))
        assert calls == [(0, 0)]  # nothing changed pending-wise: no publish
    finally:
        client.close()
