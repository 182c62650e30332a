"""The OpenAI request contract: openai.openai_requests and models.chat, case by case."""

from __future__ import annotations

import json
from typing import Any

import pytest
from openai.types.chat.parsed_chat_completion import ParsedChatCompletionMessage
from openai.types.chat.parsed_function_tool_call import ParsedFunction, ParsedFunctionToolCall

from tinyserve.config import build_config
from tinyserve.frontend.chat.chat_generation import chat_generation_of
from tinyserve.frontend.models.chat import ChatCompletionRequest
from tinyserve.frontend.models.common import ignored_fields
from tinyserve.frontend.models.errors import ApiError
from tinyserve.frontend.models.parse import parse_body
from tinyserve.frontend.openai.openai_handlers import completion_generation
from tinyserve.frontend.openai.openai_requests import CompletionRequest
from tinyserve.frontend.prompt.chat_template import TemplateMessage
from tinyserve.frontend.prompt.conversation import template_messages
from tinyserve.frontend.request.generation import Generation
from tinyserve.frontend.structured import constraints
from tinyserve.protocol import SamplingParams

CONFIG = build_config({"max_tokens_limit": 512, "default_max_tokens": 32}, environ={})
USER = [{"role": "user", "content": "hi"}]


def completion(**body: Any) -> CompletionRequest:
    raw = json.dumps({"model": "m", "prompt": "p", **body}).encode()
    return parse_body(raw, CompletionRequest)


def chat(**body: Any) -> ChatCompletionRequest:
    raw = json.dumps({"model": "m", "messages": USER, **body}).encode()
    return parse_body(raw, ChatCompletionRequest)


def msg(role: str, content: str, name: str | None = None) -> TemplateMessage:
    """A message as the chat template takes it."""
    message: TemplateMessage = {"role": role, "content": content}
    if name is not None:
        message["name"] = name
    return message


def rejected(parse: Any, **body: Any) -> ApiError:
    with pytest.raises(ApiError) as info:
        parse(**body)
    assert info.value.status == 400
    return info.value


def test_completion_defaults_follow_openai() -> None:
    req = completion()
    expected = Generation("p", 32, SamplingParams(temperature=1.0), max_tokens_asked=False)
    assert (req.model, completion_generation(req, CONFIG)) == ("m", expected)
    assert req.prompt == ["p"] and not req.include_usage


def test_every_completion_field() -> None:
    req = completion(
        max_tokens=7, temperature=0.5, top_p=0.9, top_k=4, seed=3, stop=["a", "b"],
        presence_penalty=0.5, frequency_penalty=-1, logprobs=2, priority=2, tenant="t",
        stream=True, stream_options={"include_usage": True}, n=1, user="u",
        best_of=1, echo=False, suffix=None, logit_bias={}, ignore_eos=True,
    )  # fmt: skip
    sampling = SamplingParams(
        0.5, 0.9, 4, 3, ["a", "b"],
        presence_penalty=0.5, frequency_penalty=-1.0, logprobs=2, ignore_eos=True,
    )  # fmt: skip
    assert completion_generation(req, CONFIG) == Generation(
        "p", 7, sampling, stream=True, priority=2, tenant="t"
    )
    assert req.include_usage


def test_every_chat_field() -> None:
    req = chat(
        max_completion_tokens=9, logprobs=True, top_logprobs=3, temperature=0, seed=1,
        stop="x", metadata={"k": "v"}, store=False, parallel_tool_calls=True,
        response_format={"type": "text"}, tools=[], tool_choice="none", modalities=["text"],
    )  # fmt: skip
    generation = chat_generation_of(req.turn(), CONFIG)
    assert (generation.max_tokens, generation.sampling.logprobs) == (9, 3)
    sampling = generation.sampling
    assert (sampling.temperature, sampling.seed, sampling.stop) == (0.0, 1, ["x"])
    assert template_messages(req.conversation(req.messages)) == [msg("user", "hi")]
    assert req.ends_with_generation_prompt and not req.continue_final_message


@pytest.mark.parametrize(
    ("parse", "name", "value"),
    [
        (chat, "frobnicate", 1),
        (chat, "functions_x", None),  # unknown, even as null
        (completion, "best_of", 3),
        (completion, "suffix", "tail"),
        (chat, "reasoning_effort", "high"),
        (chat, "modalities", ["text", "image"]),
    ],
)
def test_unknown_fields_and_features_we_lack_are_ignored_and_named(
    parse: Any, name: str, value: Any
) -> None:
    assert ignored_fields(parse(**{name: value})) == [name]


@pytest.mark.parametrize(
    ("parse", "name", "value"), [(completion, "best_of", 1), (chat, "modalities", ["text"])]
)
def test_a_feature_we_lack_asked_at_its_default_is_no_news(
    parse: Any, name: str, value: Any
) -> None:
    assert ignored_fields(parse(**{name: value})) == []


def test_a_feature_the_reply_cannot_do_without_is_a_400_naming_it() -> None:
    error = rejected(chat, audio={"voice": "x"})
    assert (error.param, error.type) == ("audio", "unsupported_parameter")


def test_null_is_the_default_for_every_known_field() -> None:
    fields = ChatCompletionRequest.model_fields
    req = chat(**{name: None for name, field in fields.items() if not field.is_required()})
    expected = Generation(
        "", 32, SamplingParams(temperature=1.0), prompt_field="messages", max_tokens_asked=False
    )
    assert chat_generation_of(req.turn(), CONFIG) == expected


def test_a_null_schema_in_response_format_is_any_json() -> None:
    # The document lets every optional property be null, nested ones too.
    built = [
        constraints.of_openai(chat(response_format={"type": "json_schema", "json_schema": spec}))
        for spec in ({"name": "n", "schema": None}, {"name": "n"})
    ]
    assert built[0] == built[1]
    assert built[0].schema == {}


def test_a_bool_is_no_default_number() -> None:
    assert ignored_fields(completion(best_of=True)) == ["best_of"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"logprobs": 6}, "logprobs"),
        ({"logprobs": -1}, "logprobs"),
        ({"temperature": 3}, "temperature"),
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"frequency_penalty": "1"}, "frequency_penalty"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"stop": [str(i) for i in range(17)]}, "stop"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        ({"stream": True, "stream_options": {"include_usage": 1}}, "stream_options.include_usage"),
        ({"user": 5}, "user"),
        ({"model": ""}, "model"),
        ({"prompt": ""}, "prompt"),
        ({"prompt": ["a"] * 17}, "prompt"),
        ({"prompt": ["a", [1]], "n": 0}, "n"),
        ({"prompt": ["a", "b", "c", "d"], "n": 5}, "n"),
        ({"max_tokens": 0, "echo": False}, "max_tokens"),
        ({"echo": 1}, "echo"),
        ({"prompt": [1, -2]}, "prompt"),
        ({"prompt": [1.5]}, "prompt"),
    ],
)
def test_bad_completion_fields(body: dict[str, Any], param: str) -> None:
    assert rejected(completion, **body).param == param


def test_prompt_forms() -> None:
    assert completion_generation(completion(prompt=["one"]), CONFIG).prompt == "one"
    assert completion(prompt=[5, 6]).prompt == [[5, 6]]
    assert completion(prompt=[[5, 6]]).prompt == [[5, 6]]
    assert completion(prompt=[5.0]).prompt == [[5]]
    several = completion(prompt=["a", "b"])
    assert several.prompt == ["a", "b"] and completion_generation(several, CONFIG).prompt == ""
    assert completion(prompt=[[1], [2, 3]]).prompt == [[1], [2, 3]]


def test_echo_n_and_max_tokens_0() -> None:
    req = completion(echo=True, max_tokens=0, logprobs=2, n=3)
    generation = completion_generation(req, CONFIG)
    assert (generation.max_tokens, generation.prompt_logprobs, req.n) == (0, 2, 3)
    assert (
        completion_generation(completion(logprobs=2), CONFIG).prompt_logprobs == -1
    )  # without echo
    assert (
        completion_generation(completion(echo=True), CONFIG).prompt_logprobs == -1
    )  # without logprobs


def test_user_is_the_tenant_unless_tenant_is_given() -> None:
    assert completion_generation(completion(user="team-a"), CONFIG).tenant == "team-a"
    hashed = completion_generation(completion(user="someone@example.com"), CONFIG).tenant
    assert (
        hashed.startswith("user-")
        and hashed == completion_generation(completion(user="someone@example.com"), CONFIG).tenant
    )
    assert (
        completion_generation(completion(user="someone@example.com", tenant="t"), CONFIG).tenant
        == "t"
    )
    assert completion_generation(completion(user=""), CONFIG).tenant == "default"


def test_chat_logprobs() -> None:
    assert chat_generation_of(chat().turn(), CONFIG).sampling.logprobs == -1
    assert chat_generation_of(chat(logprobs=True).turn(), CONFIG).sampling.logprobs == 0
    assert (
        chat_generation_of(chat(logprobs=True, top_logprobs=5).turn(), CONFIG).sampling.logprobs
        == 5
    )
    assert rejected(chat, top_logprobs=2).param == "top_logprobs"
    assert rejected(chat, logprobs=True, top_logprobs=6).param == "top_logprobs"


def test_max_tokens_and_max_completion_tokens() -> None:
    assert chat_generation_of(chat(max_tokens=5).turn(), CONFIG).max_tokens == 5
    assert (
        chat_generation_of(chat(max_tokens=5, max_completion_tokens=5).turn(), CONFIG).max_tokens
        == 5
    )
    assert rejected(chat, max_tokens=5, max_completion_tokens=6).param == "max_completion_tokens"
    assert chat_generation_of(chat(max_completion_tokens=10**6).turn(), CONFIG).max_tokens == 10**6


def test_messages_roles_and_content() -> None:
    messages = [
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": None, "tool_calls": None, "refusal": None},
        {"role": "user", "content": "c", "name": "bob"},
    ]
    req = chat(messages=messages)
    assert template_messages(req.conversation(req.messages)) == [
        msg("system", "be brief"),
        msg("user", "a\nb"),
        msg("assistant", ""),
        msg("user", "c", "bob"),
    ]


def test_a_reply_message_the_openai_client_parsed_can_be_sent_back_as_it_came() -> None:
    call = ParsedFunctionToolCall(
        id="call_1",
        type="function",
        function=ParsedFunction(name="f", arguments='{"a": 1}', parsed_arguments={"a": 1}),
    )
    reply = ParsedChatCompletionMessage(
        role="assistant", content='{"a": 1}', parsed={"a": 1}, tool_calls=[call]
    )
    messages = [{"role": "user", "content": "a"}, reply.model_dump()]
    req = chat(messages=messages)
    [_, assistant] = template_messages(req.conversation(req.messages))
    assert assistant["role"] == "assistant" and assistant["content"].startswith('{"a": 1}')


@pytest.mark.parametrize(
    ("messages", "param"),
    [
        ([], "messages"),
        ("hi", "messages"),
        (["hi"], "messages[0]"),
        ([{"role": "tool", "content": "x"}], "messages[0].tool_call_id"),
        ([{"role": "robot", "content": "x"}], "messages[0].role"),
        ([{"content": "x"}], "messages[0].role"),
        ([{"role": "user"}], "messages[0].content"),
        ([{"role": "user", "content": [{"image_url": "x"}]}], "messages[0].content[0]"),
        ([{"role": "user", "content": "x", "name": 3}], "messages[0].name"),
        ([{"role": "assistant", "content": "x", "tool_calls": [{"id": "1"}]}],
         "messages[0].tool_calls[0].type"),
    ],
)  # fmt: skip
def test_bad_messages(messages: Any, param: str) -> None:
    assert rejected(chat, messages=messages).param == param


def test_continue_final_message() -> None:
    prefill = [*USER, {"role": "assistant", "content": "Sure"}]
    req = chat(messages=prefill, continue_final_message=True)
    assert req.continue_final_message and not req.ends_with_generation_prompt
    assert not chat(messages=prefill, add_generation_prompt=False).continue_final_message
    both = {"continue_final_message": True, "add_generation_prompt": True}
    assert rejected(chat, messages=prefill, **both).param == "add_generation_prompt"
    assert rejected(chat, continue_final_message=True).param == "continue_final_message"


def test_a_grammar_constrains_either_route_unless_something_else_does() -> None:
    grammar = 'root ::= "yes" | "no"'
    assert constraints.of_openai(completion(grammar=grammar)).grammar == grammar
    tool = {"type": "function", "function": {"name": "f"}}
    assert (
        chat_generation_of(chat(grammar=grammar, tools=[tool]).turn(), CONFIG).sampling.grammar
        == grammar
    )
    json_format = {"type": "json_object"}
    assert rejected(completion, grammar=grammar, response_format=json_format).param == "grammar"
    assert rejected(chat, grammar=grammar, response_format=json_format).param == "grammar"
    required = rejected(chat, grammar=grammar, tools=[tool], tool_choice="required")
    assert required.param == "grammar" and "auto" in required.message
