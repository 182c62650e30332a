"""Test harness of the frontend: a stand-in engine (its sockets and board, scripted replies)
and small waiting helpers.

It speaks the real protocol over real ZeroMQ ipc sockets and writes a real board, so the
frontend under test runs unchanged; only the model is missing. Each request is answered by
``FakeEngine.script``: a list of ticks, each a list of ``RequestUpdate`` field dicts.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import struct
import time
from collections.abc import Awaitable, Callable
from typing import Any

import zmq
import zmq.asyncio
from aiohttp.test_utils import TestClient

from tinyserve import feed_protocol, protocol
from tinyserve.config import Config
from tinyserve.frontend.request.state import LINK
from tinyserve_native.board import Board

Tick = list[dict[str, Any]]
Script = Callable[[protocol.Submit], list[Tick]]

N_CTX = 512
BLOCK_SIZE = 16
BLOCKS_TOTAL = 32
MAX_QUEUE = 4
EMBEDDING_SIZE = 8


def accepted(**fields: Any) -> dict[str, Any]:
    """An update of the tick the engine accepted the request."""
    return {"accepted": True, **fields}


def with_logprobs(submit: protocol.Submit) -> list[Tick]:
    """Two tokens with logprobs, in two ticks; one prompt token from the prefix cache."""
    return [
        [accepted()],
        [{"token_ids": [28], "text": b",", "logprobs": [[-0.5, [[28, -0.5], [30, -1.5]]]]}],
        [
            {
                "token_ids": [30],
                "text": b".",
                "logprobs": [[-0.25, [[30, -0.25], [28, -2.0]]]],
                "finish_reason": protocol.FINISH_LENGTH,
                "prompt_tokens": len(submit.prompt_ids),
                "cached_tokens": 1,
            }
        ],
    ]


def default_script(submit: protocol.Submit) -> list[Tick]:
    """Accept, send "Hello" in two pieces, finish with ``stop``."""
    return [
        [accepted()],
        [{"token_ids": [1], "text": b"Hel"}],
        [
            {
                "token_ids": [2],
                "text": b"lo",
                "finish_reason": protocol.FINISH_STOP,
                "prompt_tokens": len(submit.prompt_ids),
            }
        ],
    ]


class FakeEngine:
    """Binds the engine's sockets, owns a board with a live heartbeat, answers by script."""

    def __init__(self, config: Config, tick_s: float = 0.01, frontend_slots: int = 64) -> None:
        self.config = config
        self.tick_s = tick_s
        self.started_ns = time.monotonic_ns()
        self.script: Script = default_script
        self.submits: list[protocol.Submit] = []
        self.cancels: list[protocol.Cancel] = []
        self.leases: list[feed_protocol.FeedLease] = []
        self.hellos: list[protocol.Hello] = []
        self.embeds: list[protocol.Embed] = []
        # What an Embed gets: the answer, or None for none (the test sends it, or never does).
        self.embedded: Callable[[protocol.Embed], protocol.Embedded | None] = unit_vectors
        self.acking = True  # answers every hello; False: a handshake that does not end yet
        self.beating = True
        self.n_ctx = N_CTX
        self.board = Board.create(config.board_path, frontend_slots)
        self.board.set_identity(os.getpid(), self.started_ns)
        self.publish_load()
        self.board.heartbeat(time.monotonic_ns())
        self._ctx = zmq.asyncio.Context()
        self._pull = self._ctx.socket(zmq.PULL)
        self._pub = self._ctx.socket(zmq.PUB)
        for sock in (self._pull, self._pub):
            sock.setsockopt(zmq.LINGER, 0)
        self._pull.bind(config.engine_in)
        self._pub.bind(config.engine_out)
        self._tasks: list[asyncio.Task[None]] = []

    def publish_load(self, **figures: Any) -> None:
        values = {
            "state": protocol.STATE_READY,
            "running": 0,
            "waiting": 0,
            "blocks_total": BLOCKS_TOTAL,
            "blocks_used": 0,
            "blocks_cached": 0,
            "drain_rate": 1.0,
            "ticks": 0,
        }
        values.update(figures)
        self.board.publish(**values)

    def start(self) -> FakeEngine:
        self._tasks = [asyncio.create_task(self._serve()), asyncio.create_task(self._beat())]
        return self

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._pull.close()
        self._pub.close()
        self._ctx.term()
        self.board.close()

    async def _beat(self) -> None:
        while True:
            if self.beating:
                self.board.heartbeat(time.monotonic_ns())
            await asyncio.sleep(0.05)

    async def _serve(self) -> None:
        while True:
            message = protocol.decode(await self._pull.recv())
            if isinstance(message, protocol.Hello):
                self.hellos.append(message)
                if self.acking:
                    await self._send(message.frontend_id, self._ack(message.frontend_id))
            elif isinstance(message, protocol.Submit):
                self.submits.append(message)
                self._tasks.append(asyncio.create_task(self._answer(message)))
            elif isinstance(message, protocol.Embed):
                self.embeds.append(message)
                answer = self.embedded(message)
                if answer is not None:
                    await self._send(message.frontend_id, answer)
            elif isinstance(message, protocol.Cancel):
                self.cancels.append(message)
            elif isinstance(message, feed_protocol.FeedLease):
                self.leases.append(message)

    def _ack(self, frontend_id: str) -> protocol.HelloAck:
        return protocol.HelloAck(
            frontend_id, os.getpid(), self.started_ns, "fake", self.n_ctx, 49152, 4,
            BLOCK_SIZE, BLOCKS_TOTAL, MAX_QUEUE, embedding_size=EMBEDDING_SIZE,
        )  # fmt: skip

    async def _answer(self, submit: protocol.Submit) -> None:
        seq = 0
        for tick in self.script(submit):
            updates = []
            for fields in tick:
                seq = fields.pop("seq", seq)
                updates.append(protocol.RequestUpdate(submit.request_id, seq, **fields))
                seq += 1
            await self._send(submit.frontend_id, protocol.TickOutput(submit.frontend_id, updates))
            await asyncio.sleep(self.tick_s)

    async def publish_feed(self, update: feed_protocol.FeedUpdate) -> None:
        """One event-feed update on the feed's topic, as the engine sends it."""
        await self._pub.send_multipart([feed_protocol.FEED_TOPIC, protocol.encode(update)])

    async def _send(self, frontend_id: str, message: protocol.Message) -> None:
        await self._pub.send_multipart([protocol.topic(frontend_id), protocol.encode(message)])


def unit_vectors(embed: protocol.Embed) -> protocol.Embedded:
    """Input i's vector is the unit vector along axis i (mod the size)."""
    vectors = [
        struct.pack(
            f"<{EMBEDDING_SIZE}f", *(float(j == i % EMBEDDING_SIZE) for j in range(EMBEDDING_SIZE))
        )
        for i in range(len(embed.inputs))
    ]
    tokens = sum(len(ids) for ids in embed.inputs)
    return protocol.Embedded(
        embed.frontend_id, embed.request_id, protocol.FINISH_STOP, vectors, tokens
    )


async def until(
    condition: Callable[[], bool | Awaitable[bool]], timeout_s: float = 5.0, every_s: float = 0.01
) -> None:
    """Poll ``condition`` (plain or async) until it holds; fails the test after ``timeout_s``."""

    async def poll() -> None:
        while True:
            result = condition()
            if inspect.isawaitable(result):
                result = await result
            if result:
                return
            await asyncio.sleep(every_s)

    await asyncio.wait_for(poll(), timeout_s)


async def wait_serving(client: TestClient[Any, Any], timeout_s: float = 5.0) -> None:
    """Until the frontend under test finished its handshake with the (fake) engine."""
    await asyncio.wait_for(client.app[LINK].serving.wait(), timeout_s)
