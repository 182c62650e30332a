"""Failures on real processes: settings that cannot work are refused at start-up with one line
and no traceback, by every command that takes them; an engine that breaks tells the requests
in flight and exits non-zero.

No per-request failure is reachable over HTTP: the frontend validates everything the engine
cannot take (logprobs, sampling ranges, token ids), and the one such failure llama.cpp had
(a token text over 256 bytes) is fixed; no token of the default model is over 81 bytes.
tests/engine/test_failures.py covers that tier with the core in-process.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from tinyserve import protocol
from tinyserve.config import build_config
from tinyserve.engine.proc import EngineProcess
from tinyserve.protocol import decode, encode
from tinyserve.rundir import prepare_runtime_dir

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("command", ["engine", "serve"])
@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (("--slots", "300", "--max-batch-tokens", "256"), ("--slots 300", "--max-batch-tokens")),
        (
            ("--block-size", "8192", "--ctx-per-slot", "4096"),
            ("--block-size 8192", "--ctx-per-slot 4096"),
        ),
    ],
)
def test_settings_that_cannot_work_are_refused_in_one_line(
    tmp_path: Path, command: str, flags: tuple[str, ...], named: tuple[str, ...]
) -> None:
    argv = [sys.executable, "-m", "tinyserve.cli", command, "--runtime-dir", str(tmp_path / "run")]
    done = subprocess.run([*argv, *flags], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert all(name in lines[0] for name in named), lines[0]
    assert not (tmp_path / "run").exists()  # refused before anything was set up


# -- the second tier: the engine itself fails ------------------------------------------------

FRONTEND_ID = "e" * 32


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[EngineProcess]:
    settings = {"runtime_dir": str(tmp_path / "run"), "ctx_per_slot": 256, "slots": 2, "threads": 1}
    config = build_config(settings, environ={})
    prepare_runtime_dir(config.runtime_dir)
    process = EngineProcess(config)
    process.start()
    try:
        yield process
    finally:
        process.close()


def test_a_broken_engine_tells_its_requests_and_exits_non_zero(
    engine: EngineProcess, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    ctx = zmq.Context()
    push, sub = ctx.socket(zmq.PUSH), ctx.socket(zmq.SUB)
    try:
        push.connect(engine.config.engine_in)
        sub.connect(engine.config.engine_out)
        sub.setsockopt(zmq.SUBSCRIBE, protocol.topic(FRONTEND_ID))
        greet(engine, push, sub)

        def decode_fails() -> int:
            raise RuntimeError("llama.cpp context lost")

        # The context itself failing: no request is to blame, the engine cannot go on.
        monkeypatch.setattr(engine.runtime, "decode", decode_fails)
        sampling = protocol.SamplingParams()
        push.send(encode(protocol.Submit("r1", FRONTEND_ID, list(range(100, 120)), sampling, 4)))
        with pytest.raises(SystemExit) as stopped:
            engine.serve()
        assert stopped.value.code == 1
        finals = [u for u in updates(sub) if u.finish_reason is not None]
        assert [(u.request_id, u.finish_reason) for u in finals] == [("r1", protocol.FINISH_ERROR)]
        assert finals[0].detail == "engine failed (RuntimeError)"
        critical = [r for r in caplog.records if r.levelno == logging.CRITICAL]
        assert [r.getMessage() for r in critical] == [
            "engine failed, exiting with status 1: RuntimeError: llama.cpp context lost"
        ]
    finally:
        push.close(0)
        sub.close(0)
        ctx.term()


def greet(engine: EngineProcess, push: zmq.Socket[bytes], sub: zmq.Socket[bytes]) -> None:
    """Hello until the HelloAck arrives: the SUB is then surely connected."""
    for _ in range(50):
        push.send(encode(protocol.Hello(FRONTEND_ID, os.getpid())))
        engine._receive(block=True)
        if sub.poll(100):
            assert isinstance(decode(sub.recv_multipart()[1]), protocol.HelloAck)
            return
    raise AssertionError("no HelloAck")


def updates(sub: zmq.Socket[bytes]) -> list[protocol.RequestUpdate]:
    found: list[protocol.RequestUpdate] = []
    while sub.poll(500):
        message = decode(sub.recv_multipart()[1])
        if isinstance(message, protocol.TickOutput):
            found += message.updates
    return found
