"""A subscriber that stops reading while 64 streams run loses no engine output."""

from __future__ import annotations

import os
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator

import pytest
import zmq

from tinyserve import protocol as p

from .node import Node

pytestmark = pytest.mark.integration

STREAMS = 64


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    running = Node(
        tmp_path_factory.mktemp("slow"), "--ctx-per-slot", "256", "--max-queue", "64", frontends=1
    ).start()
    yield running
    assert running.stop() == 0


def handshake(push: zmq.Socket, sub: zmq.Socket, frontend_id: str) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        push.send(p.encode(p.Hello(frontend_id, os.getpid())))  # a live pid, or it is reaped
        if sub.poll(200) and isinstance(p.decode(sub.recv_multipart()[1]), p.HelloAck):
            return
    raise AssertionError("no HelloAck")


def test_a_stalled_subscriber_gets_every_update_of_64_streams(node: Node) -> None:
    ctx = zmq.Context()
    push, sub = ctx.socket(zmq.PUSH), ctx.socket(zmq.SUB)
    frontend_id = uuid.uuid4().hex
    try:
        sub.setsockopt(zmq.RCVHWM, 0)  # as a frontend does: only the engine side could drop
        sub.setsockopt(zmq.SUBSCRIBE, p.topic(frontend_id))
        sub.connect(f"ipc://{node.runtime_dir}/engine.out")
        push.connect(f"ipc://{node.runtime_dir}/engine.in")
        handshake(push, sub, frontend_id)
        for i in range(STREAMS):
            push.send(
                p.encode(
                    p.Submit(f"r{i}", frontend_id, [1, 504, 28, i + 30], p.SamplingParams(), 6)
                )
            )
        time.sleep(3.0)  # a frontend whose event loop is stuck: nothing read meanwhile
        seqs: dict[str, list[int]] = defaultdict(list)
        finals: dict[str, str] = {}
        deadline = time.monotonic() + 120
        while len(finals) < STREAMS and time.monotonic() < deadline:
            if not sub.poll(1000):
                continue
            message = p.decode(sub.recv_multipart()[1])
            if isinstance(message, p.TickOutput):
                for update in message.updates:
                    seqs[update.request_id].append(update.seq)
                    if update.finish_reason is not None:
                        finals[update.request_id] = update.finish_reason
    finally:
        push.close(0)
        sub.close(0)
        ctx.term()
    assert len(finals) == STREAMS
    assert set(finals.values()) <= {p.FINISH_LENGTH, p.FINISH_STOP}
    for request_id, numbers in seqs.items():
        assert numbers == list(range(len(numbers))), request_id  # no update lost
