"""The OpenAPI document stays in sync with the routes, carries the node's limits, and
describes the replies the server really sends."""

from __future__ import annotations

import json
from typing import Any

import jsonschema_rs
import pytest
from aiohttp.test_utils import TestClient

from tests.frontend.harness import FakeEngine, accepted, with_logprobs
from tinyserve import protocol
from tinyserve.config import build_config
from tinyserve.frontend.anthropic.anthropic_requests import CountTokensRequest, MessagesRequest
from tinyserve.frontend.http.openapi_document import document
from tinyserve.frontend.models.chat import ChatCompletionRequest
from tinyserve.frontend.models.errors import ApiError
from tinyserve.frontend.models.parse import parse_body
from tinyserve.frontend.native.native_bodies import GenerateRequest
from tinyserve.frontend.openai.openai_requests import CompletionRequest
from tinyserve.frontend.responses.responses_requests import ResponsesRequest
from tinyserve.frontend.tokenize.tokenize_bodies import TokenizeRequest

Client = TestClient[Any, Any]
CHAT = {"model": "fake", "messages": [{"role": "user", "content": "Hi"}]}
COMPLETION = {"model": "fake", "prompt": "Hi"}


def refs(node: Any) -> list[str]:
    """Every ``$ref`` below ``node``."""
    if isinstance(node, dict):
        own = [node["$ref"]] if "$ref" in node else []
        return own + [r for value in node.values() for r in refs(value)]
    if isinstance(node, list):
        return [r for item in node for r in refs(item)]
    return []


def assert_conforms(schema_name: str, instance: Any) -> None:
    """``instance`` is valid by the served document's component ``schema_name``."""
    root = {"$ref": f"#/components/schemas/{schema_name}", "components": DOC["components"]}
    errors = [e.message for e in jsonschema_rs.validator_for(root).iter_errors(instance)]
    assert not errors, (schema_name, instance, errors)


DOC = document()


async def test_every_route_is_documented_and_nothing_else(client: Client) -> None:
    routes = {
        (route.method.lower(), route.resource.canonical)
        for route in client.app.router.routes()
        if route.resource is not None and route.method != "HEAD"  # aiohttp adds HEAD to GETs
    }
    documented = {(method, path) for path, item in document()["paths"].items() for method in item}
    assert documented == routes


async def test_served_document_is_the_document_of_the_node(client: Client) -> None:
    response = await client.get("/openapi.json")
    assert response.status == 200
    assert await response.json() == DOC


def test_every_reference_resolves() -> None:
    names = {f"#/components/schemas/{name}" for name in DOC["components"]["schemas"]}
    assert set(refs(DOC)) <= names


@pytest.mark.parametrize(
    ("schema", "fields", "low"),
    [
        ("GenerateRequest", ["max_tokens"], 1),
        ("CompletionRequest", ["max_tokens"], 0),  # 0 with echo: the prompt alone
        ("ChatCompletionRequest", ["max_tokens", "max_completion_tokens"], 1),
        ("ResponsesRequest", ["max_output_tokens"], 1),
    ],
)
def test_output_lengths_have_no_upper_bound(schema: str, fields: list[str], low: int) -> None:
    # More than a node serves is clamped to what it serves (and said so), never refused.
    properties = DOC["components"]["schemas"][schema]["properties"]
    for field in fields:
        [bounded] = [s for s in properties[field]["anyOf"] if s.get("type") == "integer"]
        assert bounded["minimum"] == low and "maximum" not in bounded


def test_a_required_output_length_is_never_null() -> None:
    schema = DOC["components"]["schemas"]["MessagesRequest"]
    assert "max_tokens" in schema["required"]
    bounded = schema["properties"]["max_tokens"]
    assert (bounded["type"], bounded["minimum"]) == ("integer", 1)


def sse_payloads(body: bytes) -> list[Any]:
    events = body.decode().split("\n\n")
    return [json.loads(e.removeprefix("data: ")) for e in events[:-1] if e != "data: [DONE]"]


GENERATION_CASES = [
    ("/generate", {"prompt": "Hi"}, "GenerateReply", "GenerateEvent"),
    ("/generate", {"prompt": "Hi", "timeline": True}, "GenerateReply", "GenerateEvent"),
    ("/v1/completions", {**COMPLETION, "logprobs": 1}, "Completion", "CompletionChunk"),
    ("/v1/completions", {**COMPLETION, "stream_options": {"include_usage": True}},
     "Completion", "CompletionChunk"),
    ("/v1/chat/completions", {**CHAT, "logprobs": True, "top_logprobs": 1}, "ChatCompletion",
     "ChatCompletionChunk"),
    ("/v1/chat/completions", {**CHAT, "stream_options": {"include_usage": True}},
     "ChatCompletion", "ChatCompletionChunk"),
]  # fmt: skip


@pytest.mark.parametrize(("path", "body", "whole", "event"), GENERATION_CASES)
async def test_generation_replies_conform(
    served: Client, engine: FakeEngine, path: str, body: dict[str, Any], whole: str, event: str
) -> None:
    engine.script = with_logprobs
    stream = "stream_options" in body
    if not stream:
        reply = await served.post(path, json=body)
        assert reply.status == 200
        assert_conforms(whole, await reply.json())
    reply = await served.post(path, json={**body, "stream": True})
    assert reply.status == 200
    payloads = sse_payloads(await reply.read())
    assert len(payloads) >= 3
    for payload in payloads:
        assert_conforms(event, payload)


MORE_CASES = [
    ("/v1/completions", {**COMPLETION, "n": 2, "logprobs": 1}, "Completion"),
    ("/v1/completions", {**COMPLETION, "prompt": [[1, 2], [3]], "echo": True, "logprobs": 1},
     "Completion"),
    ("/v1/chat/completions", {**CHAT, "n": 2, "logprobs": True}, "ChatCompletion"),
    ("/tokenize", {"prompt": "Hi", "return_token_strs": True}, "TokenizeReply"),
    ("/tokenize", {"messages": CHAT["messages"]}, "TokenizeReply"),
    ("/detokenize", {"tokens": [1, 2]}, "DetokenizeReply"),
    ("/v1/messages/count_tokens", {"model": "fake", "messages": CHAT["messages"]}, "TokenCount"),
]  # fmt: skip


@pytest.mark.parametrize(("path", "body", "schema"), MORE_CASES)
async def test_several_choices_and_tokenizer_replies_conform(
    served: Client, engine: FakeEngine, path: str, body: dict[str, Any], schema: str
) -> None:
    engine.script = with_logprobs
    reply = await served.post(path, json=body)
    assert reply.status == 200, await reply.text()
    assert_conforms(schema, await reply.json())


async def test_other_replies_conform(served: Client) -> None:
    gets = [("/health", "HealthReply"), ("/ready", "HealthReply"), ("/v1/models", "ModelList"),
            ("/tokenizer_info", "TokenizerInfo")]  # fmt: skip
    for path, schema in gets:
        reply = await served.get(path)
        assert reply.status == 200
        assert_conforms(schema, await reply.json())


TOOL_CALL = '<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>'
ANTHROPIC = {"model": "fake", "max_tokens": 8, "messages": CHAT["messages"]}
RESPONSES = {"model": "fake", "input": "Hi"}
NAMED_EVENTS_CASES = [
    ("/v1/messages", ANTHROPIC, "AnthropicMessage", "MessagesEvent"),
    ("/v1/messages", {**ANTHROPIC, "tools": [{"name": "f", "input_schema": {"type": "object"}}]},
     "AnthropicMessage", "MessagesEvent"),
    ("/v1/responses", RESPONSES, "Response", "ResponsesEvent"),
    ("/v1/responses", {**RESPONSES, "tools": [{"type": "function", "name": "f"}]}, "Response",
     "ResponsesEvent"),
]  # fmt: skip


def progress_then(text: str) -> Any:
    """A script: accepted, prefill progress, ``text`` in one token, stop."""

    def script(submit: protocol.Submit) -> list[list[dict[str, Any]]]:
        end = {"finish_reason": protocol.FINISH_STOP, "prompt_tokens": len(submit.prompt_ids)}
        return [[accepted()], [{"prompt_done": 4, "cached_tokens": 2}],
                [{"token_ids": [1], "text": text.encode(), **end}]]  # fmt: skip

    return script


@pytest.mark.parametrize(("path", "body", "whole", "event"), NAMED_EVENTS_CASES)
async def test_anthropic_and_responses_replies_conform(
    served: Client, engine: FakeEngine, path: str, body: dict[str, Any], whole: str, event: str
) -> None:
    engine.script = progress_then(TOOL_CALL if "tools" in body else "Hello")
    reply = await served.post(path, json=body)
    assert reply.status == 200, await reply.text()
    assert_conforms(whole, await reply.json())
    reply = await served.post(path, json={**body, "stream": True, "return_progress": True})
    events = (await reply.read()).decode().split("\n\n")[:-1]
    assert len(events) >= 5
    for text in events:
        name, data = text.split("\n")
        payload = json.loads(data.removeprefix("data: "))
        assert name == "event: " + payload["type"]
        assert_conforms(event, payload)


async def test_error_replies_conform(served: Client, engine: FakeEngine) -> None:
    native = await served.post("/generate", json={"prompt": "Hi", "top_k": -1})
    assert native.status == 400
    assert_conforms("Error", await native.json())
    openai = await served.post("/v1/completions", json={**COMPLETION, "n": 0})
    assert openai.status == 400
    assert_conforms("OpenAIError", await openai.json())
    responses = await served.post("/v1/responses", json={**RESPONSES, "background": True})
    assert responses.status == 400
    assert_conforms("OpenAIError", await responses.json())
    anthropic = await served.post("/v1/messages", json={**ANTHROPIC, "max_tokens": 0})
    assert anthropic.status == 400
    assert_conforms("AnthropicError", await anthropic.json())
    failure = {"finish_reason": protocol.FINISH_ERROR, "detail": "decode failed"}
    engine.script = lambda submit: [[accepted()], [failure]]
    failed = await served.post("/generate", json={"prompt": "Hi", "stream": True})
    assert failed.status == 200
    [event] = sse_payloads(await failed.read())
    assert event["finish_reason"] == "error"
    assert_conforms("GenerateEvent", event)


# Rules across fields that JSON Schema cannot state: the fields' descriptions say them in
# words, and the fuzz test (tests/integration/test_fuzz.py) lets their 400s through for
# bodies the document accepts. Every other rule is in the document.
UNSTATED_RULES = (
    "prompts x n is",  # a bound on a product of two fields
    "'max_tokens' and 'max_completion_tokens' differ",
    "needs a final message from",
    "'tools' names a function twice",
    "no tool is named",
    # JSON Schema can say this one, but not in a document schemathesis still generates from.
    "'grammar' excludes a 'response_format' other than text",
    "turn cannot hold a",  # an Anthropic block of the other role's turn (a "contains" rule)
    "has no message to answer",  # Responses input of ignored items only (any type but ours)
)
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
USER = [{"role": "user", "content": "Hi"}]
REQUESTS = {
    "GenerateRequest": GenerateRequest,
    "CompletionRequest": CompletionRequest,
    "ChatCompletionRequest": ChatCompletionRequest,
    "TokenizeRequest": TokenizeRequest,
}
# One body per rule across fields (``cross_field`` in the models), and the 400 it gets.
RULES_ACROSS_FIELDS = [
    ("GenerateRequest", {"prompt": "x", "grammar": 'root ::= "a"', "json_schema": {}},
     "'grammar' and 'json_schema' exclude each other"),
    ("CompletionRequest", {**COMPLETION, "stream_options": {}}, "only allowed with 'stream'"),
    ("CompletionRequest", {**COMPLETION, "max_tokens": 0}, "'max_tokens': 0 needs 'echo'"),
    ("CompletionRequest", {**COMPLETION, "stream": True, "echo": True}, "'echo' does not stream"),
    ("CompletionRequest", {**COMPLETION, "prompt": ["a", "b", "c"], "n": 6}, "prompts x n is"),
    ("ChatCompletionRequest", {**CHAT, "top_logprobs": 2}, "'top_logprobs' needs 'logprobs'"),
    ("ChatCompletionRequest", {**CHAT, "max_tokens": 3, "max_completion_tokens": 4},
     "'max_tokens' and 'max_completion_tokens' differ"),
    ("ChatCompletionRequest", {**CHAT, "continue_final_message": True,
                               "add_generation_prompt": True}, "exclude each other"),
    ("ChatCompletionRequest", {**CHAT, "continue_final_message": True},
     "needs a final message from"),
    ("ChatCompletionRequest", {**CHAT, "tool_choice": "required"}, "'tool_choice' needs 'tools'"),
    ("ChatCompletionRequest", {**CHAT, "tool_choice": {"type": "function",
                                                      "function": {"name": "f"}}},
     "'tool_choice' needs 'tools'"),
    ("ChatCompletionRequest", {**CHAT, "tools": [TOOL, TOOL]}, "'tools' names a function twice"),
    ("ChatCompletionRequest", {**CHAT, "tools": [TOOL], "tool_choice": {
        "type": "function", "function": {"name": "g"}}}, "no tool is named 'g'"),
    ("ChatCompletionRequest", {**CHAT, "messages": [{"role": "user"}]}, "is required unless"),
    ("ChatCompletionRequest", {**CHAT, "messages": [{"role": "tool", "content": "x"}]},
     "needs 'messages[0].tool_call_id'"),
    ("TokenizeRequest", {}, "exactly one of 'prompt' and 'messages'"),
    ("TokenizeRequest", {"prompt": "x", "messages": USER}, "exactly one of"),
    ("TokenizeRequest", {"messages": USER, "add_special_tokens": True}, "applies to 'prompt' only"),
    ("TokenizeRequest", {"prompt": "x", "tools": [TOOL]}, "applies to 'messages' only"),
    ("TokenizeRequest", {"prompt": "x", "tool_choice": "none"}, "applies to 'messages' only"),
    ("TokenizeRequest", {"prompt": "x", "add_generation_prompt": False},
     "applies to 'messages' only"),
    ("TokenizeRequest", {"prompt": "x", "continue_final_message": True},
     "applies to 'messages' only"),
    ("TokenizeRequest", {"messages": USER, "continue_final_message": True,
                         "add_generation_prompt": True}, "exclude each other"),
    ("TokenizeRequest", {"messages": USER, "continue_final_message": True},
     "needs a final message from"),
    ("TokenizeRequest", {"messages": USER, "tool_choice": "auto"}, "'tool_choice' needs 'tools'"),
    ("TokenizeRequest", {"messages": USER, "tools": [TOOL, TOOL]},
     "'tools' names a function twice"),
]  # fmt: skip
# ... and bodies near those rules that both take.
NEAR_RULES = [
    ("GenerateRequest", {"prompt": "x", "grammar": "", "json_schema": {}}),
    ("GenerateRequest", {"prompt": "x", "grammar": 'root ::= "a"', "json_schema": None}),
    ("ChatCompletionRequest", {**CHAT, "tool_choice": "none"}),
    ("ChatCompletionRequest", {**CHAT, "tools": [TOOL], "tool_choice": "none",
                               "response_format": {"type": "json_object"}}),
    ("ChatCompletionRequest", {**CHAT, "tools": [TOOL], "response_format": {"type": "text"}}),
    ("ChatCompletionRequest", {**CHAT, "tools": [], "response_format": {"type": "json_object"}}),
    ("ChatCompletionRequest", {**CHAT, "tools": [TOOL], "tool_choice": {
        "type": "function", "function": {"name": "f"}}}),
    ("TokenizeRequest", {"prompt": "x", "tools": [], "continue_final_message": False,
                         "add_generation_prompt": None, "tool_choice": None}),
    ("TokenizeRequest", {"messages": USER, "tools": [TOOL], "tool_choice": "none"}),
]  # fmt: skip
NODE = build_config({"max_tokens_limit": 256}, environ={})


def document_accepts(schema_name: str, body: dict[str, Any]) -> bool:
    root = {"$ref": f"#/components/schemas/{schema_name}", "components": DOC["components"]}
    return bool(jsonschema_rs.validator_for(root).is_valid(body))


@pytest.mark.parametrize(("schema", "body", "refusal"), RULES_ACROSS_FIELDS)
def test_rules_across_fields_are_in_the_document(
    schema: str, body: dict[str, Any], refusal: str
) -> None:
    with pytest.raises(ApiError) as refused:
        parse_body(json.dumps(body).encode(), REQUESTS[schema])
    assert refused.value.status == 400 and refusal in refused.value.message
    unstated = any(rule in refused.value.message for rule in UNSTATED_RULES)
    assert document_accepts(schema, body) == unstated


@pytest.mark.parametrize(("schema", "body"), NEAR_RULES)
def test_bodies_near_those_rules_are_taken_by_both(schema: str, body: dict[str, Any]) -> None:
    parse_body(json.dumps(body).encode(), REQUESTS[schema])
    assert document_accepts(schema, body)


ANTHROPIC_TOOL = {"name": "f", "input_schema": {"type": "object"}}
RESPONSES_TOOL = {"type": "function", "name": "f"}
TRANSLATED = {
    "MessagesRequest": MessagesRequest,
    "CountTokensRequest": CountTokensRequest,
    "ResponsesRequest": ResponsesRequest,
}
# The rules of the surfaces translated into conversations: their own, and chat's, which
# their validators apply in chat's words.
TRANSLATED_RULES = [
    ("MessagesRequest", {**ANTHROPIC, "tool_choice": {"type": "any"}},
     "'tool_choice' needs 'tools'"),
    ("CountTokensRequest", {"model": "fake", "messages": CHAT["messages"], "tool_choice": {
        "type": "tool", "name": "f"}}, "'tool_choice' needs 'tools'"),
    ("MessagesRequest", {**ANTHROPIC, "tools": [ANTHROPIC_TOOL] * 2}, "names a function twice"),
    ("MessagesRequest", {**ANTHROPIC, "tools": [ANTHROPIC_TOOL], "tool_choice": {
        "type": "tool", "name": "g"}}, "no tool is named 'g'"),
    ("MessagesRequest", {**ANTHROPIC, "messages": [{"role": "user", "content": [
        {"type": "tool_use", "id": "t", "name": "f", "input": {}}]}]}, "turn cannot hold a"),
    ("ResponsesRequest", {**RESPONSES, "tool_choice": "required"}, "'tool_choice' needs 'tools'"),
    ("ResponsesRequest", {**RESPONSES, "tool_choice": {"type": "function", "name": "f"}},
     "'tool_choice' needs 'tools'"),
    ("ResponsesRequest", {**RESPONSES, "tools": [RESPONSES_TOOL] * 2}, "names a function twice"),
    ("ResponsesRequest", {**RESPONSES, "tools": [RESPONSES_TOOL], "tool_choice": {
        "type": "function", "name": "g"}}, "no tool is named 'g'"),
]  # fmt: skip
TRANSLATED_NEAR_RULES = [
    ("MessagesRequest", {**ANTHROPIC, "tool_choice": {"type": "auto"}}),
    ("MessagesRequest", {**ANTHROPIC, "tools": [ANTHROPIC_TOOL], "tool_choice": {"type": "none"},
                         "output_config": {"format": {"type": "json_schema", "schema": {}}}}),
    ("ResponsesRequest", {**RESPONSES, "tool_choice": "auto"}),
    ("ResponsesRequest", {**RESPONSES, "tools": [RESPONSES_TOOL], "text": {
        "format": {"type": "text"}}}),
    ("ResponsesRequest", {**RESPONSES, "tools": [RESPONSES_TOOL], "tool_choice": "none",
                          "text": {"format": {"type": "json_object"}}}),
    ("ResponsesRequest", {**RESPONSES, "tools": [RESPONSES_TOOL], "text": {
        "format": {"type": "json_object"}}}),
    ("MessagesRequest", {**ANTHROPIC, "tools": [ANTHROPIC_TOOL], "output_config": {
        "format": {"type": "json_schema", "schema": {}}}}),
]  # fmt: skip


def translated(schema: str, body: dict[str, Any]) -> None:
    """Parse ``body`` and translate it into its conversation, as the route does."""
    req = parse_body(json.dumps(body).encode(), TRANSLATED[schema])
    req.conversation() if isinstance(req, CountTokensRequest) else req.turn()


@pytest.mark.parametrize(("schema", "body", "refusal"), TRANSLATED_RULES)
def test_translated_surfaces_rules_are_in_the_document(
    schema: str, body: dict[str, Any], refusal: str
) -> None:
    with pytest.raises(ApiError) as refused:
        translated(schema, body)
    assert refused.value.status == 400 and refusal in refused.value.message
    unstated = any(rule in refused.value.message for rule in UNSTATED_RULES)
    assert document_accepts(schema, body) == unstated


@pytest.mark.parametrize(("schema", "body"), TRANSLATED_NEAR_RULES)
def test_bodies_near_the_translated_rules_are_taken_by_both(
    schema: str, body: dict[str, Any]
) -> None:
    translated(schema, body)
    assert document_accepts(schema, body)
