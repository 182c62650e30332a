"""JSON Schemas of the HTTP bodies, for the OpenAPI document (``openapi``).

Request schemas are built from the parsers' own tables (``validation.FIELDS``,
``openai_schema``'s supported/ignored/default-only sets and limits), and a test checks that
every accepted field has a property, so the document cannot drift from what the server takes.
"""

from __future__ import annotations

from typing import Any

from tinyserve.frontend import openai_schema as oa
from tinyserve.frontend.chat_template import ROLES
from tinyserve.frontend.openai_messages import ROLE_ALIASES
from tinyserve.frontend.validation import (
    MAX_STOP_CHARS,
    MAX_STOP_STRINGS,
    PENALTY_RANGE,
    PRIORITY_RANGE,
    SEED_MAX,
    TEMPERATURE_MAX,
)

Schema = dict[str, Any]


def _t(type_: str | list[str], description: str, **extra: Any) -> Schema:
    return {"type": type_, "description": description, **extra}


def ref(name: str) -> Schema:
    """A reference to a component schema."""
    return {"$ref": f"#/components/schemas/{name}"}


def _object(properties: dict[str, Schema], required: list[str], closed: bool = True) -> Schema:
    return {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": not closed,
    }


_STOP = {
    "description": f"generation ends before the first of these (at most {MAX_STOP_STRINGS}, "
    f"1 to {MAX_STOP_CHARS} characters each); the stop string is not returned",
    "anyOf": [
        {"type": "string"},
        {"type": "array", "items": {"type": "string"}, "maxItems": MAX_STOP_STRINGS},
        {"type": "null"},
    ],
}
_PENALTY = {"minimum": PENALTY_RANGE[0], "maximum": PENALTY_RANGE[1]}
SHARED: dict[str, Schema] = {
    "max_tokens": _t(["integer", "null"], "tokens to generate (--default-max-tokens when "
                     "absent, at most --max-tokens-limit)", minimum=1),
    "stream": _t(["boolean", "null"], "reply as server-sent events"),
    "temperature": _t(["number", "null"], "0 is greedy", minimum=0, maximum=TEMPERATURE_MAX),
    "top_p": _t(["number", "null"], "nucleus sampling", exclusiveMinimum=0, maximum=1),
    "top_k": _t(["integer", "null"], "0 disables it", minimum=0),
    "ignore_eos": _t(["boolean", "null"], "never end at an end-of-generation token"),
    "seed": _t(["integer", "null"], "sampling seed; same seed, same text", minimum=0,
               maximum=SEED_MAX),
    "stop": _STOP,
    "priority": _t(["integer", "null"], "larger is more important (--policy priority)",
                   minimum=PRIORITY_RANGE[0], maximum=PRIORITY_RANGE[1]),
    "tenant": _t(["string", "null"], "fairness group", pattern="^[A-Za-z0-9._-]{1,64}$"),
}  # fmt: skip

GENERATE_REQUEST = _object(
    {
        "prompt": _t("string", "text to continue; special tokens are parsed", minLength=1),
        "timeline": _t(["boolean", "null"], "add the engine's timeline to the final object"),
        **SHARED,
    },
    ["prompt"],
)

_OPENAI_COMMON: dict[str, Schema] = {
    **SHARED,
    "model": _t("string", "the id GET /v1/models lists"),
    "temperature": {**SHARED["temperature"], "default": oa.DEFAULT_TEMPERATURE},
    "n": _t(["integer", "null"], "choices per request: only 1", enum=[1, None]),
    "stream_options": {
        "type": ["object", "null"],
        "properties": {
            "include_usage": _t(["boolean", "null"], "end the stream with a usage chunk"),
            "include_obfuscation": _t(["boolean", "null"], "accepted and ignored"),
        },
        "additionalProperties": False,
    },
    "presence_penalty": _t(["number", "null"], "penalise tokens already present", **_PENALTY),
    "frequency_penalty": _t(["number", "null"], "penalise tokens by their count", **_PENALTY),
    "user": _t(["string", "null"], "end user; the scheduling tenant unless 'tenant' is given "
               "(as is when a valid tenant name, else hashed)"),
}  # fmt: skip
_LOGPROBS_COUNT = _t(["integer", "null"], "alternatives per token", minimum=0,
                     maximum=oa.MAX_LOGPROBS)  # fmt: skip


def _not_supported(table: dict[str, tuple[Any, ...]]) -> dict[str, Schema]:
    return {
        name: {"description": "not supported: only the default is accepted",
               "enum": [None, *allowed]}
        for name, allowed in table.items()
    }  # fmt: skip


def _ignored(names: frozenset[str]) -> dict[str, Schema]:
    return {name: {"description": "accepted and ignored"} for name in sorted(names)}


_PROMPT = {
    "description": "a string, token ids, or a list holding one of either",
    "anyOf": [
        {"type": "string", "minLength": 1},
        {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1},
        {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 1},
        {"type": "array", "minItems": 1, "maxItems": 1,
         "items": {"type": "array", "items": {"type": "integer", "minimum": 0}}},
    ],
}  # fmt: skip
COMPLETION_REQUEST = _object(
    {
        **_OPENAI_COMMON,
        "prompt": _PROMPT,
        "logprobs": _LOGPROBS_COUNT,
        **_not_supported(oa.COMPLETION_DEFAULT_ONLY),
    },
    ["model", "prompt"],
)

_TEXT_PART = _object({"type": {"const": "text"}, "text": {"type": "string"}}, ["type", "text"])
CHAT_MESSAGE = _object(
    {
        "role": {"enum": [*ROLES, *ROLE_ALIASES]},
        "content": {"anyOf": [{"type": "string"}, {"type": "array", "items": _TEXT_PART},
                              {"type": "null"}]},
        "name": {"type": "string"},
    },
    ["role"],
)  # fmt: skip
CHAT_REQUEST = _object(
    {
        **_OPENAI_COMMON,
        "messages": {"type": "array", "items": ref("ChatMessage"), "minItems": 1},
        "logprobs": _t(["boolean", "null"], "report logprobs of each token"),
        "top_logprobs": _LOGPROBS_COUNT,
        "max_completion_tokens": {**SHARED["max_tokens"], "description": "same as max_tokens"},
        "add_generation_prompt": _t(["boolean", "null"], "end the prompt with the assistant's "
                                    "header (default: true unless continue_final_message)"),
        "continue_final_message": _t(["boolean", "null"], "the reply continues the final "
                                     "(assistant) message"),
        **_ignored(oa.CHAT_IGNORED),
        **_not_supported(oa.CHAT_DEFAULT_ONLY),
    },
    ["model", "messages"],
)  # fmt: skip

# -- replies -------------------------------------------------------------------------------------

_INT: Schema = {"type": "integer"}
_STR: Schema = {"type": "string"}
NATIVE_ERROR = _object(
    {"error": _object({"type": _STR, "message": _STR, "reason": _STR}, ["type", "message"])},
    ["error"],
)
OPENAI_ERROR = _object(
    {
        "error": _object(
            {"message": _STR, "type": _STR, "param": {"type": ["string", "null"]},
             "code": {"type": ["string", "null"]}},
            ["message", "type", "param", "code"],
        )
    },
    ["error"],
)  # fmt: skip
GENERATE_REPLY = _object(
    {
        "id": _STR,
        "text": _STR,
        "finish_reason": {"enum": ["stop", "length", "cancelled", "queue_timeout", "timeout"]},
        "usage": _object({"prompt_tokens": _INT, "completion_tokens": _INT},
                         ["prompt_tokens", "completion_tokens"]),
        "timeline": {"type": "object"},
    },
    ["id", "text", "finish_reason", "usage"],
)  # fmt: skip
GENERATE_EVENT = {
    "description": "a text delta {id, text}; the one final event adds finish_reason and usage "
    "(and timeline), or error with finish_reason 'error'",
    "type": "object",
}
USAGE = _object(
    {
        "prompt_tokens": _INT,
        "completion_tokens": _INT,
        "total_tokens": _INT,
        "prompt_tokens_details": _object({"cached_tokens": _INT}, ["cached_tokens"]),
    },
    ["prompt_tokens", "completion_tokens", "total_tokens"],
)
_FINISH = {"enum": ["stop", "length"]}
_LOGPROBS = {
    "type": ["object", "null"],
    "description": "completions: {tokens, token_logprobs, top_logprobs, text_offset}; "
    "chat: {content: [{token, logprob, bytes, top_logprobs}], refusal}",
}


def _reply(object_: str, choice: dict[str, Schema], usage_required: bool) -> Schema:
    choice_schema = _object(
        {"index": _INT, **choice, "logprobs": _LOGPROBS}, ["index", *choice, "logprobs"]
    )
    properties = {
        "id": _STR,
        "object": {"const": object_},
        "created": _INT,
        "model": _STR,
        "choices": {"type": "array", "items": choice_schema},
        "usage": USAGE if usage_required else {"anyOf": [USAGE, {"type": "null"}]},
    }
    required = ["id", "object", "created", "model", "choices"]
    return _object(properties, [*required, "usage"] if usage_required else required)


_MESSAGE = _object({"role": {"const": "assistant"}, "content": _STR}, ["role", "content"])
_DELTA = _object({"role": {"const": "assistant"}, "content": _STR}, [])
_CHUNK_FINISH = {"anyOf": [_FINISH, {"type": "null"}]}
COMPLETION = _reply("text_completion", {"text": _STR, "finish_reason": _FINISH}, True)
COMPLETION_CHUNK = _reply("text_completion", {"text": _STR, "finish_reason": _CHUNK_FINISH}, False)
CHAT_COMPLETION = _reply("chat.completion", {"message": _MESSAGE, "finish_reason": _FINISH}, True)
CHAT_COMPLETION_CHUNK = _reply(
    "chat.completion.chunk", {"delta": _DELTA, "finish_reason": _CHUNK_FINISH}, False
)
MODEL_LIST = _object(
    {
        "object": {"const": "list"},
        "data": {
            "type": "array",
            "items": _object(
                {"id": _STR, "object": {"const": "model"}, "created": _INT, "owned_by": _STR},
                ["id", "object", "created", "owned_by"],
            ),
        },
    },
    ["object", "data"],
)
STATUS = _object({"status": _STR, "model": _STR}, ["status"])

SCHEMAS: dict[str, Schema] = {
    "GenerateRequest": GENERATE_REQUEST,
    "GenerateReply": GENERATE_REPLY,
    "GenerateEvent": GENERATE_EVENT,
    "Error": NATIVE_ERROR,
    "Status": STATUS,
    "CompletionRequest": COMPLETION_REQUEST,
    "Completion": COMPLETION,
    "CompletionChunk": COMPLETION_CHUNK,
    "ChatMessage": CHAT_MESSAGE,
    "ChatCompletionRequest": CHAT_REQUEST,
    "ChatCompletion": CHAT_COMPLETION,
    "ChatCompletionChunk": CHAT_COMPLETION_CHUNK,
    "ModelList": MODEL_LIST,
    "OpenAIError": OPENAI_ERROR,
}
