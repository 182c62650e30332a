"""Junk on the frontend's SUB socket is logged (rate-limited) and dropped; the listener lives
on and the next real request is served."""

from __future__ import annotations

import logging
from typing import Any

import msgpack
import pytest
from aiohttp.test_utils import TestClient

from tests.frontend.harness import FakeEngine
from tinyserve import protocol
from tinyserve.frontend.request.state import CLIENT

Client = TestClient[Any, Any]


async def test_junk_from_the_engine_side_is_dropped(
    served: Client, engine: FakeEngine, caplog: pytest.LogCaptureFixture
) -> None:
    topic = protocol.topic(served.app[CLIENT].frontend_id)
    good = protocol.TickOutput(served.app[CLIENT].frontend_id, [])
    junk = [
        [topic, b"\xc1"],
        [topic, b"\x81\x80\x00"],
        [topic, msgpack.packb([protocol.PROTOCOL_VERSION + 1, 12])],
        [topic, msgpack.packb([protocol.PROTOCOL_VERSION, 77, "x"])],
        [topic, msgpack.packb([protocol.PROTOCOL_VERSION, 12, "f", "not a list", None])],
        [topic, msgpack.packb([protocol.PROTOCOL_VERSION, 12, "f", [["r", "0"]], None])],
        [topic],
        [topic, protocol.encode(good), b"extra frame"],
    ]
    caplog.set_level(logging.WARNING, "tinyserve.frontend.link.engine_client")
    for _ in range(50):
        for frames in junk:
            await engine._pub.send_multipart(frames)
    response = await served.post("/generate", json={"prompt": "Hi"})
    assert response.status == 200 and (await response.json())["text"] == "Hello"
    dropped = [r for r in caplog.records if r.getMessage() == "dropping engine message"]
    # 400 junk messages, a handful of log lines: one per 5 s, the rest counted.
    assert 1 <= len(dropped) <= 3
