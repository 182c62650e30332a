"""One trace per request across the ZMQ hop, seen by one in-memory exporter.

The real engine (``EngineProcess``: model, board, sockets) runs its loop in a thread and the
real frontend app runs in the test's event loop; they share nothing but the ZeroMQ sockets
and the board, so the engine's spans can only join the frontend's trace through the W3C
context inside the ``Submit``.
"""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from tests.frontend.harness import wait_serving
from tinyserve.config import Config, build_config
from tinyserve.engine.proc import EngineProcess
from tinyserve.frontend.http.app import build_app
from tinyserve.rundir import prepare_runtime_dir
from tinyserve.tracing import Tracing

pytestmark = pytest.mark.integration

CHUNK = 16
PROMPT = "one two three four five six seven eight nine ten eleven twelve thirteen fourteen"
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"


@pytest.fixture(scope="module")
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture(scope="module")
def tracing(exporter: InMemorySpanExporter) -> Tracing:
    return Tracing.with_processor(SimpleSpanProcessor(exporter), "tinyserve-test")


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Config:
    settings = {
        "runtime_dir": str(tmp_path_factory.mktemp("tracing") / "run"),
        "ctx_per_slot": 512,
        "slots": 1,
        "chunk": CHUNK,
        "max_batch_tokens": 64,
        "threads": 1,
        "prefix_cache": False,  # every request prefills its whole prompt: known chunking
        "queue_timeout": 1.0,
        "policy": "fifo",
    }
    return build_config(settings, environ={})


@pytest.fixture(scope="module")
def engine(config: Config, tracing: Tracing) -> Iterator[EngineProcess]:
    prepare_runtime_dir(config.runtime_dir)
    process = EngineProcess(config, tracing)
    process.start()
    loop = threading.Thread(target=process.serve, name="engine-loop")
    loop.start()
    yield process
    process.request_stop(signal.SIGTERM, None)
    loop.join(timeout=30)
    process.close()


@pytest.fixture
async def client(
    engine: EngineProcess, config: Config, tracing: Tracing, exporter: InMemorySpanExporter
) -> AsyncIterator[TestClient[Any, Any]]:
    async with TestClient(TestServer(build_app(config, tracing))) as test_client:
        await wait_serving(test_client, timeout_s=30)
        exporter.clear()
        yield test_client


async def generate(
    client: TestClient[Any, Any], headers: dict[str, str] | None = None, **body: Any
) -> dict[str, Any]:
    response = await client.post("/generate", json=body, headers=headers or {})
    assert response.status == 200, await response.text()
    reply: dict[str, Any] = await response.json()
    return reply


async def spans_of(exporter: InMemorySpanExporter, trace_id: int) -> list[ReadableSpan]:
    """The trace's spans once the engine's (made when the request finishes) are in."""
    for _ in range(200):
        spans = [s for s in exporter.get_finished_spans() if s.context.trace_id == trace_id]
        if any(s.name == "engine.decode" for s in spans):
            return spans
        await asyncio.sleep(0.01)
    raise AssertionError(f"no engine spans in trace {trace_id:032x}")


def children(spans: list[ReadableSpan], parent: ReadableSpan, name: str) -> list[ReadableSpan]:
    found = [s for s in spans if s.name == name]
    assert all(s.parent is not None and s.parent.span_id == parent.context.span_id for s in found)
    return found


async def test_one_trace_per_request_with_engine_spans_under_the_frontend_span(
    client: TestClient[Any, Any], exporter: InMemorySpanExporter
) -> None:
    traceparent = f"00-{TRACE_ID}-{PARENT_ID}-01"
    first = await generate(
        client,
        {"traceparent": traceparent},
        prompt=PROMPT,
        max_tokens=4,
        ignore_eos=True,
        timeline=True,
    )
    second = await generate(
        client, prompt=PROMPT + " fifteen", max_tokens=3, ignore_eos=True, timeline=True
    )
    servers = [s for s in exporter.get_finished_spans() if s.kind is SpanKind.SERVER]
    assert len(servers) == 2  # one trace per request
    assert len({s.context.trace_id for s in servers}) == 2
    for server, reply in zip(servers, (first, second), strict=True):
        assert server.name == "POST /generate"
        assert server.attributes is not None
        assert server.attributes["tinyserve.request_id"] == reply["id"]
        spans = await spans_of(exporter, server.context.trace_id)
        assert len(children(spans, server, "admission")) == 1
        assert len(children(spans, server, "streaming")) == 1
        assert len(children(spans, server, "engine.queue_wait")) == 1
        chunks = children(spans, server, "engine.prefill_chunk")
        prompt_tokens = reply["usage"]["prompt_tokens"]
        expected = [CHUNK] * (prompt_tokens // CHUNK) + [prompt_tokens % CHUNK] * bool(
            prompt_tokens % CHUNK
        )
        by_start = sorted(chunks, key=lambda s: s.start_time or 0)
        assert [s.attributes["tinyserve.tokens"] for s in by_start if s.attributes] == expected
        assert [c["tokens"] for c in reply["timeline"]["prefill"]] == expected
        (decode,) = children(spans, server, "engine.decode")
        assert decode.attributes is not None
        assert (
            decode.attributes["tinyserve.generated_tokens"] == reply["usage"]["completion_tokens"]
        )
        # Engine spans lie inside the frontend's request span (one host-wide monotonic clock).
        assert server.start_time is not None and server.end_time is not None
        assert all(server.start_time <= (s.start_time or 0) for s in spans)
        assert all((s.end_time or 0) <= server.end_time for s in spans)
    # The incoming traceparent was honoured: the first request joined the caller's trace.
    assert f"{servers[0].context.trace_id:032x}" == TRACE_ID
    assert servers[0].parent is not None and f"{servers[0].parent.span_id:016x}" == PARENT_ID
    assert servers[1].parent is None


async def test_a_request_that_timed_out_in_the_queue_marks_its_spans_failed(
    client: TestClient[Any, Any], exporter: InMemorySpanExporter
) -> None:
    # One slot and --queue-timeout 1: a long request holds the slot while another expires.
    long = asyncio.create_task(generate(client, prompt=PROMPT, max_tokens=400, ignore_eos=True))
    await asyncio.sleep(0.3)
    expired = await generate(client, prompt="hello", max_tokens=2)
    assert expired["finish_reason"] == "queue_timeout"
    long.cancel()
    queue_spans: list[ReadableSpan] = []
    for _ in range(200):
        queue_spans = [
            s
            for s in exporter.get_finished_spans()
            if s.name == "engine.queue_wait" and s.status.status_code is StatusCode.ERROR
        ]
        if queue_spans:
            break
        await asyncio.sleep(0.01)
    assert len(queue_spans) == 1
    (server,) = [
        s
        for s in exporter.get_finished_spans()
        if s.kind is SpanKind.SERVER
        and s.attributes
        and s.attributes.get("tinyserve.request_id") == expired["id"]
    ]
    assert server.status.status_code is StatusCode.ERROR
    assert queue_spans[0].context.trace_id == server.context.trace_id
