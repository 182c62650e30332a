"""Schemathesis against ``/openapi.json`` of a real node (issue 8, fuzzing).

Every documented operation gets ``CASES`` generated requests per generation mode: positive
(valid by the document) and, for operations that take input, negative (invalid by it), all
derandomized so a run is reproducible. The node has small limits (``--max-tokens-limit 8``,
``--ctx-per-slot 256``, two slots) so each generated request costs little.

What every case must show:
- an answer within ``REQUEST_TIMEOUT_S`` (no hang) that is not a 5xx, except a 503 admission
  rejection that names its reason;
- a status, content type, headers and body that the document declares for the operation;
- negative cases: a 4xx (the server is at least as strict as the document);
- positive cases: a 2xx, or a refusal the document cannot express because it depends on the
  served model (the prompt does not fit the context, tokenizes to nothing, or names token ids
  outside the vocabulary): the document is not looser than the server.
Afterwards the node is healthy: ``/ready`` is 200, a plain ``/generate`` works, and the board
is back at idle.

``schemathesis.pytest.from_fixture`` fails under pytest 9 (it sets a node attribute pytest no
longer has), so cases come from ``as_strategy`` under Hypothesis's own ``@given``.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import GenerationMode
from schemathesis.specs.openapi import checks as st_checks

from tests.frontend.http.test_openapi_document import UNSTATED_RULES
from tinyserve.frontend.http.openapi_document import OPERATIONS, Operation
from tinyserve_native.board import Board

from .node import Node

pytestmark = pytest.mark.integration

CASES = 40  # generated requests per operation and mode (Hypothesis stops early on a GET)
REQUEST_TIMEOUT_S = 30.0
NODE_FLAGS = (
    *("--max-tokens-limit", "8", "--default-max-tokens", "4"),
    *("--ctx-per-slot", "256", "--slots", "2", "--max-queue", "4"),
)
ADMISSION_REASONS = {"queue_full"}
# Refusals of valid-looking input that depend on the served model or the prompt's token count,
# which the document cannot know.
MODEL_DEPENDENT_TYPES = {"context_length_exceeded", "prompt_too_long"}
MODEL_DEPENDENT = ("tokenizes to 0 tokens", "is not in the vocabulary", "embedding size")
# Languages inside a string or object field, which JSON Schema cannot check: a GBNF grammar
# (llama.cpp's parser decides) and a JSON schema (``response_format``'s, or a tool's
# parameters) that is no schema.
EMBEDDED = ("' does not compile: ", "' is not a schema: ", "' parameters: ")
# Rules across fields that JSON Schema cannot state (the document says them in words; a
# unit test holds the models' other rules to the document), and the constraint check's.
CROSS_FIELD = (*UNSTATED_RULES, "' cannot be combined with '")
CONFORMANCE = [
    st_checks.status_code_conformance,
    st_checks.content_type_conformance,
    st_checks.response_headers_conformance,
    st_checks.response_schema_conformance,
]


def _modes(op: Operation) -> list[GenerationMode]:
    # A path parameter that may be any string has no negative cases.
    return [GenerationMode.POSITIVE, *([GenerationMode.NEGATIVE] if op.request else [])]


# A stream that ends only when its client leaves: a generated GET would wait forever.
# tests/integration/test_dashboard_feed.py and tests/frontend/dashboard test it.
ENDLESS = frozenset({"/v1/events"})
RUNS = [
    pytest.param(op, mode, id=f"{op.method.upper()} {op.path} {mode.value}")
    for op in OPERATIONS
    if op.path not in ENDLESS
    for mode in _modes(op)
]


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    running = Node(tmp_path_factory.mktemp("fuzz"), *NODE_FLAGS, frontends=1).start()
    yield running
    assert running.stop() == 0


@pytest.fixture(scope="module")
def schema(node: Node) -> Any:
    # Failure reports show real values: "max_tokens" looks like a secret to the sanitizer.
    config = schemathesis.Config.from_dict({"output": {"sanitization": {"enabled": False}}})
    return schemathesis.openapi.from_url(f"{node.url}/openapi.json", config=config)


@pytest.fixture(scope="module")
def model(node: Node) -> str:
    return str(requests.get(f"{node.url}/v1/models", timeout=10).json()["data"][0]["id"])


@pytest.mark.parametrize(("op", "mode"), RUNS)
def test_generated_requests(
    node: Node, schema: Any, model: str, op: Operation, mode: GenerationMode
) -> None:
    statuses: Counter[int] = Counter()
    # negative_data_rejection also knows when a mutation happens to be valid on the wire.
    verdict = acceptance if mode is GenerationMode.POSITIVE else st_checks.negative_data_rejection

    @settings(
        max_examples=CASES,
        derandomize=True,
        database=None,
        deadline=None,
        # No shrinking: on a real server it can take minutes; the failure shows its curl.
        phases=[Phase.explicit, Phase.generate],
        # Generated bodies are large and negative generation filters a lot; neither matters.
        suppress_health_check=list(HealthCheck),
    )
    @given(case=schema[op.path][op.method.upper()].as_strategy(mode))
    def run(case: Any) -> None:
        if mode is GenerationMode.POSITIVE and isinstance(case.body, dict) and "model" in case.body:
            case.body["model"] = model  # else nearly every positive case is a 404
        response = case.call(timeout=REQUEST_TIMEOUT_S)
        statuses[response.status_code] += 1
        assert_not_a_server_error(response)
        case.validate_response(response, checks=CONFORMANCE, additional_checks=[verdict])

    run()
    print(f"{op.method.upper()} {op.path} {mode.value}: statuses {dict(sorted(statuses.items()))}")
    assert_healthy(node)


def assert_not_a_server_error(response: requests.Response) -> None:
    if response.status_code < 500:
        return
    reason = response.json()["error"].get("reason") or response.json()["error"].get("code")
    assert response.status_code == 503 and reason in ADMISSION_REASONS, (
        response.text,
        response.request.body,
    )


def acceptance(ctx: Any, response: Any, case: Any) -> bool | None:
    """Input the document calls valid is served, or refused only for a model-dependent reason."""
    if response.status_code < 300 or response.status_code in (404, 503):
        return True  # 404: no such request id (the model id is always the served one)
    error = response.json()["error"]
    kind = error.get("code") or error.get("type")
    message = error["message"]
    assert response.status_code == 400, f"valid by the document, refused: {response.text}"
    known = (*MODEL_DEPENDENT, *EMBEDDED, *CROSS_FIELD)
    assert kind in MODEL_DEPENDENT_TYPES or any(m in message for m in known), (
        f"the document accepts what the server refuses: {message}"
    )
    return True


def assert_healthy(node: Node) -> None:
    """``/ready`` 200, every KV block and slot released, and a normal request served."""
    assert requests.get(f"{node.url}/ready", timeout=10).status_code == 200
    # The last case may have ended while its other choices' cancels were still on their way
    # (a call with n > 1 fails whole): first the engine goes idle, then the frontend's count
    # of requests sent but not yet answered drains within a tick or two.
    wait_idle(node)
    deadline = time.monotonic() + 10
    while True:
        reply = requests.post(
            f"{node.url}/generate", json={"prompt": "Hello", "max_tokens": 2}, timeout=60
        )
        if reply.status_code != 503 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert reply.status_code == 200, reply.text
    assert reply.json()["finish_reason"] in {"stop", "length"}
    wait_idle(node)


def wait_idle(node: Node) -> None:
    """Until the engine holds no request and no KV block (30 s at most)."""
    board = Board.attach(str(node.runtime_dir / "board"))
    try:
        deadline = time.monotonic() + 30
        while (snap := board.snapshot()).running or snap.waiting or snap.blocks_used:
            assert time.monotonic() < deadline, f"board not idle: {snap}"
            time.sleep(0.05)
    finally:
        board.close()
