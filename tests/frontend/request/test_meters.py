"""The frontend's metrics through GET /metrics: request outcomes, latencies, rejections, link.

The app runs in this test process, which has one metrics directory for all its apps (the
first one set up), so every check compares the figures before and after.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from aiohttp.test_utils import TestClient
from prometheus_client.parser import text_string_to_metric_families

from tests.frontend.harness import MAX_QUEUE, FakeEngine, Tick, accepted, until
from tinyserve import protocol
from tinyserve.frontend.http.middlewares import UNMATCHED_ROUTE

Client = TestClient[Any, Any]
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


async def scrape(client: Client) -> Samples:
    response = await client.get("/metrics")
    assert response.status == 200
    assert response.headers["Content-Type"].startswith("text/plain")
    found: Samples = {}
    for family in text_string_to_metric_families(await response.text()):
        for s in family.samples:
            found[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return found


def get(found: Samples, name: str, **labels: str) -> float:
    return found.get((name, tuple(sorted(labels.items()))), 0.0)


def delta(before: Samples, after: Samples, name: str, **labels: str) -> float:
    return get(after, name, **labels) - get(before, name, **labels)


async def test_a_finished_request_is_counted_with_its_latencies(served: Client) -> None:
    before = await scrape(served)
    response = await served.post("/generate", json={"prompt": "hi", "max_tokens": 4})
    assert response.status == 200
    after = await scrape(served)
    assert delta(before, after, "tinyserve_requests_total", finish_reason="stop", code="200") == 1
    for name in (
        "tinyserve_time_to_first_token_seconds_count",
        "tinyserve_request_duration_seconds_count",
        "tinyserve_inter_token_latency_seconds_count",  # two tokens in two pieces: one gap
        "tinyserve_request_prompt_tokens_count",
        "tinyserve_request_generation_tokens_count",
    ):
        assert delta(before, after, name) == 1, name
    assert delta(before, after, "tinyserve_request_generation_tokens_sum") == 2
    # The fake engine ticks every 10 ms: the first token comes after at least one tick.
    ttft = delta(before, after, "tinyserve_time_to_first_token_seconds_sum")
    e2e = delta(before, after, "tinyserve_request_duration_seconds_sum")
    assert 0.005 < ttft <= e2e


async def test_board_rejection_and_engine_rejection_are_told_apart(
    served: Client, engine: FakeEngine
) -> None:
    def rejected(_submit: protocol.Submit) -> list[Tick]:
        return [[{"finish_reason": protocol.FINISH_REJECTED, "detail": "draining"}]]

    before = await scrape(served)
    engine.script = rejected
    response = await served.post("/generate", json={"prompt": "hi", "max_tokens": 4})
    assert response.status == 503
    engine.publish_load(waiting=MAX_QUEUE + 4, running=4)
    response = await served.post("/generate", json={"prompt": "hi", "max_tokens": 4})
    assert response.status == 503
    after = await scrape(served)
    rejections = "tinyserve_admission_rejections_total"
    assert delta(before, after, rejections, stage="frontend", reason="queue_full") == 1
    # The engine counts its own rejections (this fake one does not): nothing doubled here.
    assert delta(before, after, rejections, stage="frontend", reason="draining") == 0
    assert (
        delta(before, after, "tinyserve_requests_total", finish_reason="rejected", code="503") == 2
    )


async def test_client_that_leaves_is_counted_as_a_cancellation(
    served: Client, engine: FakeEngine
) -> None:
    def slow(_submit: protocol.Submit) -> list[Tick]:
        return [[accepted()]] + [[{"token_ids": [1], "text": b"x"}] for _ in range(500)]

    engine.tick_s = 0.02
    engine.script = slow
    before = await scrape(served)
    response = await served.post(
        "/generate", json={"prompt": "hi", "max_tokens": 200, "stream": True}
    )
    assert response.status == 200
    assert (await response.content.readuntil(b"\n\n")).startswith(b"data: ")
    response.close()
    await until(lambda: len(engine.cancels) == 1)
    await asyncio.sleep(0.05)
    after = await scrape(served)
    cancelled = "tinyserve_cancellations_total"
    assert delta(before, after, cancelled, reason="client_disconnect") == 1
    # The stream's 200 had gone out: the status sent is counted, not nginx's 499.
    requests = "tinyserve_requests_total"
    assert delta(before, after, requests, finish_reason="cancelled", code="200") == 1
    responses = "tinyserve_http_responses_total"
    assert delta(before, after, responses, route="/generate", code="200") == 1
    assert delta(before, after, responses, route="/generate", code="499") == 0


async def test_engine_up_follows_the_heartbeat(served: Client, engine: FakeEngine) -> None:
    me = str(os.getpid())
    assert get(await scrape(served), "tinyserve_engine_up", pid=me) == 1
    engine.beating = False

    async def down() -> bool:
        return get(await scrape(served), "tinyserve_engine_up", pid=me) == 0

    await until(down, timeout_s=5.0, every_s=0.1)


async def test_every_response_is_counted_by_route_and_status(served: Client) -> None:
    responses = "tinyserve_http_responses_total"
    before = await scrape(served)
    assert (await served.post("/generate", json={"prompt": "hi", "max_tokens": 4})).status == 200
    # Refused before the pipeline: the request counter never sees these.
    json_type = {"Content-Type": "application/json"}
    assert (await served.post("/generate", data=b"{not json", headers=json_type)).status == 400
    assert (
        await served.post("/generate", data=b"{}", headers={"Content-Type": "text/plain"})
    ).status == 415
    assert (await served.get("/generate")).status == 405
    assert (await served.get("/no/such/path/42")).status == 404
    assert (await served.get("/v1/requests/abc")).status in {404, 503}
    after = await scrape(served)
    assert delta(before, after, responses, route="/generate", code="200") == 1
    assert delta(before, after, responses, route="/generate", code="400") == 1
    assert delta(before, after, responses, route="/generate", code="415") == 1
    assert delta(before, after, responses, route=UNMATCHED_ROUTE, code="405") == 1  # no route
    assert delta(before, after, responses, route=UNMATCHED_ROUTE, code="404") == 1
    # A path parameter is counted under its pattern, not the id (a bounded label).
    by_pattern = [key for key in after if key[0] == responses and "/v1/requests/{" in str(key)]
    assert by_pattern and not [key for key in after if "abc" in str(key)]
    # The scrape before the second one counted itself.
    assert delta(before, after, responses, route="/metrics", code="200") == 1
