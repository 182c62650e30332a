"""Parsing ``POST /v1/completions`` and ``POST /v1/chat/completions`` bodies into typed requests.

Every field of OpenAI's request schemas falls in one of four groups, and the tables below are
the contract (``docs/api.md`` lists them, the OpenAPI document is built from them):

- supported: checked like ``/generate``'s fields (the ``check_*`` functions of ``validation``);
- ignored: bookkeeping or hints for OpenAI's own service that cannot change the output;
- default only: features this server does not have; accepted when they ask for the default
  (``n: 1``, ``tools: []``, ...), else a 400 naming the field;
- anything else: a 400 naming the unknown field.

``null`` means the default for every known field. Extensions: ``priority``, ``tenant``,
``top_k``, ``ignore_eos``, and for chat ``add_generation_prompt`` / ``continue_final_message``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from tinyserve.config import Config
from tinyserve.frontend.api_errors import ApiError, invalid
from tinyserve.frontend.chat_template import ChatMessage
from tinyserve.frontend.openai_messages import parse_messages
from tinyserve.frontend.validation import (
    TENANT_PATTERN,
    GenerateRequest,
    check_bool,
    check_max_tokens,
    check_penalty,
    check_prompt,
    common_fields,
    encodable,
    is_int,
    load_object,
    optional,
)

MAX_LOGPROBS = 5
DEFAULT_TEMPERATURE = 1.0  # OpenAI's default; /generate's is 0 (greedy)
UNSUPPORTED_PARAMETER = "unsupported_parameter"

_COMMON = frozenset(
    {"model", "max_tokens", "n", "stream", "stream_options", "temperature", "top_p", "seed",
     "stop", "presence_penalty", "frequency_penalty", "user", "priority", "tenant", "top_k",
     "ignore_eos"}
)  # fmt: skip
COMPLETION_FIELDS = _COMMON | {"prompt", "logprobs"}
CHAT_FIELDS = _COMMON | {
    "messages", "logprobs", "top_logprobs", "max_completion_tokens",
    "add_generation_prompt", "continue_final_message",
}  # fmt: skip
CHAT_IGNORED = frozenset(
    {"metadata", "store", "service_tier", "safety_identifier", "prompt_cache_key",
     "prompt_cache_retention", "prompt_cache_options", "parallel_tool_calls"}
)  # fmt: skip
# Field -> the non-null values that ask for the default behaviour (none: only null).
COMPLETION_DEFAULT_ONLY: dict[str, tuple[Any, ...]] = {
    "best_of": (1,), "echo": (False,), "suffix": ("",), "logit_bias": ({},),
}  # fmt: skip
CHAT_DEFAULT_ONLY: dict[str, tuple[Any, ...]] = {
    "logit_bias": ({},), "response_format": ({"type": "text"},), "tools": ([],),
    "tool_choice": ("none",), "functions": ([],), "function_call": ("none",),
    "modalities": (["text"],), "audio": (), "prediction": (), "web_search_options": (),
    "reasoning_effort": (), "verbosity": (), "moderation": (),
}  # fmt: skip
_STREAM_OPTIONS = frozenset({"include_usage", "include_obfuscation"})  # the latter: ignored


@dataclass(frozen=True)
class OpenAIRequest:
    """A checked OpenAI request. ``generate.prompt`` is empty for chat until the messages are
    rendered, and for a completion whose prompt came as token ids (``prompt_ids``)."""

    model: str
    generate: GenerateRequest
    include_usage: bool = False
    prompt_ids: list[int] | None = None
    messages: list[ChatMessage] = field(default_factory=list)
    add_generation_prompt: bool = True
    continue_final_message: bool = False


def parse_completion(body: bytes, config: Config) -> OpenAIRequest:
    """Check a completions body; raises a 400 ``ApiError`` naming the field at fault."""
    data = load_object(body)
    _check_fields(data, COMPLETION_FIELDS, frozenset(), COMPLETION_DEFAULT_ONLY)
    prompt, prompt_ids = _completion_prompt(data.get("prompt"))
    max_tokens = check_max_tokens("max_tokens", data.get("max_tokens"), config)
    logprobs = optional(data, "logprobs", _logprobs_count, -1)
    generate = _generate(data, prompt, max_tokens, logprobs)
    return OpenAIRequest(_model(data), generate, _include_usage(data, generate), prompt_ids)


def parse_chat(body: bytes, config: Config) -> OpenAIRequest:
    """Check a chat completions body; raises a 400 ``ApiError`` naming the field at fault."""
    data = load_object(body)
    _check_fields(data, CHAT_FIELDS, CHAT_IGNORED, CHAT_DEFAULT_ONLY)
    messages = parse_messages(data.get("messages"))
    continue_final = optional(data, "continue_final_message", check_bool, False)
    add_generation = optional(data, "add_generation_prompt", check_bool, not continue_final)
    _check_continuation(messages, add_generation, continue_final)
    generate = _generate(data, "", _chat_max_tokens(data, config), _chat_logprobs(data))
    return OpenAIRequest(
        _model(data),
        generate,
        _include_usage(data, generate),
        messages=messages,
        add_generation_prompt=add_generation,
        continue_final_message=continue_final,
    )


def unsupported(name: str, detail: str) -> ApiError:
    """A 400 for a field that asks for a feature this server does not have."""
    return ApiError(400, UNSUPPORTED_PARAMETER, f"{name!r} is not supported: {detail}", param=name)


def _check_fields(
    data: dict[str, Any],
    supported: frozenset[str],
    ignored: frozenset[str],
    default_only: dict[str, tuple[Any, ...]],
) -> None:
    for name, value in data.items():
        if name not in supported and name not in ignored and name not in default_only:
            raise invalid(f"unknown field {name!r}", name)
        if name not in default_only or value is None:
            continue
        allowed = default_only[name]
        # type() too: True == 1 in Python, but "best_of": true is not a default.
        if not any(type(value) is type(a) and value == a for a in allowed):
            accepted = " or ".join(repr(a) for a in (None, *allowed))
            raise unsupported(name, f"this server accepts only {accepted}")


def _generate(data: dict[str, Any], prompt: str, max_tokens: int, logprobs: int) -> GenerateRequest:
    optional(data, "n", _one_choice, 1)
    fields = common_fields(data, temperature=DEFAULT_TEMPERATURE)
    if data.get("tenant") is None:
        fields["tenant"] = _tenant_of_user(data.get("user"))
    return GenerateRequest(
        prompt=prompt,
        max_tokens=max_tokens,
        presence_penalty=optional(data, "presence_penalty", check_penalty, 0.0),
        frequency_penalty=optional(data, "frequency_penalty", check_penalty, 0.0),
        logprobs=logprobs,
        **fields,
    )


def _model(data: dict[str, Any]) -> str:
    model = data.get("model")
    if not isinstance(model, str) or not model:
        raise invalid("'model' is required: the id that GET /v1/models lists", "model")
    return model


def _one_choice(name: str, value: Any) -> int:
    if not is_int(value) or value != 1:
        raise unsupported(name, "this server returns one choice per request; send n requests")
    return 1


def _tenant_of_user(user: Any) -> str:
    """``user`` as the scheduling tenant: as it is when it is a valid tenant name, else a
    stable hash of it (OpenAI suggests hashed e-mail addresses and the like)."""
    if user is None or user == "":
        return "default"
    if not isinstance(user, str):
        raise invalid("'user' must be a string", "user")
    if TENANT_PATTERN.fullmatch(user):
        return user
    digest = hashlib.sha256(encodable("user", user).encode("utf-8")).hexdigest()
    return "user-" + digest[:16]


def _include_usage(data: dict[str, Any], generate: GenerateRequest) -> bool:
    options = data.get("stream_options")
    if options is None:
        return False
    if not generate.stream:
        raise invalid("'stream_options' is only allowed with 'stream': true", "stream_options")
    if not isinstance(options, dict):
        raise invalid("'stream_options' must be an object", "stream_options")
    unknown = sorted(set(options) - _STREAM_OPTIONS)
    if unknown:
        raise invalid(f"unknown field 'stream_options.{unknown[0]}'", "stream_options")
    value = options.get("include_usage")
    return value is not None and check_bool("stream_options.include_usage", value)


def _completion_prompt(value: Any) -> tuple[str, list[int] | None]:
    """A prompt string, or token ids; a list of one of either is taken as that one."""
    if isinstance(value, list) and value and all(isinstance(v, str | list) for v in value):
        if len(value) > 1:
            raise unsupported("prompt", "one prompt per request (no batches)")
        value = value[0]
    if not isinstance(value, list):
        return check_prompt(value), None
    if not value or not all(is_int(t) and t >= 0 for t in value):
        raise invalid("'prompt' token ids must be a non-empty list of integers >= 0", "prompt")
    return "", [int(t) for t in value]


def _logprobs_count(name: str, value: Any) -> int:
    if not is_int(value) or not 0 <= value <= MAX_LOGPROBS:
        raise invalid(f"{name!r} must be an integer between 0 and {MAX_LOGPROBS}", name)
    return int(value)


def _chat_logprobs(data: dict[str, Any]) -> int:
    wanted = optional(data, "logprobs", check_bool, False)
    top = optional(data, "top_logprobs", _logprobs_count, None)
    if top is not None and not wanted:
        raise invalid("'top_logprobs' needs 'logprobs': true", "top_logprobs")
    return (top or 0) if wanted else -1


def _chat_max_tokens(data: dict[str, Any], config: Config) -> int:
    new, old = data.get("max_completion_tokens"), data.get("max_tokens")
    if new is not None and old is not None and new != old:
        raise invalid("'max_tokens' and 'max_completion_tokens' differ", "max_completion_tokens")
    name = "max_tokens" if new is None else "max_completion_tokens"
    return check_max_tokens(name, data.get(name), config)


def _check_continuation(
    messages: list[ChatMessage], add_generation: bool, continue_final: bool
) -> None:
    if not continue_final:
        return
    if add_generation:
        raise invalid(
            "'continue_final_message' and 'add_generation_prompt' exclude each other",
            "add_generation_prompt",
        )
    if messages[-1].role != "assistant":
        raise invalid(
            "'continue_final_message' needs a final message from the assistant",
            "continue_final_message",
        )
