"""JSON Schemas of the HTTP bodies, for the OpenAPI document (``openapi``).

Request schemas are built from the parsers' own tables (``validation.FIELDS``,
``openai_schema``'s supported/ignored/default-only sets and limits), and a test checks that
every accepted field has a property, so the document cannot drift from what the server takes.
"""

from __future__ import annotations

from typing import Any

from tinyserve.frontend import openai_schema as oa
from tinyserve.frontend.chat_template import ROLES
from tinyserve.frontend.openai_messages import MESSAGE_EMPTY_ONLY, ROLE_ALIASES
from tinyserve.frontend.validation import (
    MAX_STOP_CHARS,
    MAX_STOP_STRINGS,
    PENALTY_RANGE,
    PRIORITY_RANGE,
    SEED_MAX,
    TEMPERATURE_MAX,
    TOP_K_MAX,
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


_STOP_STRING = {"type": "string", "minLength": 1, "maxLength": MAX_STOP_CHARS}
_STOP = {
    "description": f"generation ends before the first of these (at most {MAX_STOP_STRINGS}, "
    f"1 to {MAX_STOP_CHARS} characters each); the stop string is not returned",
    "anyOf": [
        _STOP_STRING,
        {"type": "array", "items": _STOP_STRING, "maxItems": MAX_STOP_STRINGS},
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
    "top_k": _t(["integer", "null"], "0 disables it", minimum=0, maximum=TOP_K_MAX),
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
    "model": _t("string", "the id GET /v1/models lists", minLength=1),
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
        {"type": "array", "items": {"type": "string", "minLength": 1}, "minItems": 1,
         "maxItems": 1},
        {"type": "array", "minItems": 1, "maxItems": 1,
         "items": {"type": "array", "items": {"type": "integer", "minimum": 0}}},
    ],
}  # fmt: skip


def _implies(field: str, value: Schema, then: dict[str, Schema], present: bool = True) -> Schema:
    """A rule across fields: when ``field`` is present and matches ``value``, each field of
    ``then`` matches its schema (and, with ``present``, must be there)."""
    return {
        "if": {"properties": {field: value}, "required": [field]},
        "then": {"properties": then, "required": list(then) if present else []},
    }


# As OpenAI does: stream_options only with a stream.
_STREAM_RULE = _implies("stream_options", {"type": "object"}, {"stream": {"const": True}})
COMPLETION_REQUEST = {
    **_object(
        {
            **_OPENAI_COMMON,
            "prompt": _PROMPT,
            "logprobs": _LOGPROBS_COUNT,
            **_not_supported(oa.COMPLETION_DEFAULT_ONLY),
        },
        ["model", "prompt"],
    ),
    **_STREAM_RULE,
}

_TEXT_PART = _object({"type": {"const": "text"}, "text": {"type": "string"}}, ["type", "text"])
_CONTENT: list[Schema] = [{"type": "string"}, {"type": "array", "items": _TEXT_PART, "minItems": 1}]
_EMPTY_ONLY: dict[str, Schema] = {
    name: {"description": "not supported: accepted only empty", "enum": [None, "", [], {}]}
    for name in sorted(MESSAGE_EMPTY_ONLY)
}


def _message(roles: list[str], content: list[Schema], required: list[str]) -> Schema:
    properties: dict[str, Schema] = {"role": {"enum": roles}, "content": {"anyOf": content},
                  "name": {"type": ["string", "null"]}, **_EMPTY_ONLY}  # fmt: skip
    return _object(properties, required)


CHAT_MESSAGE = {
    "description": "content is required, except in an assistant message (null or absent: "
    "a turn that only called tools)",
    "anyOf": [
        _message(["assistant"], [*_CONTENT, {"type": "null"}], ["role"]),
        _message([r for r in (*ROLES, *ROLE_ALIASES) if r != "assistant"], _CONTENT,
                 ["role", "content"]),
    ],
}  # fmt: skip
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
# Not expressible here, checked by the server: max_tokens and max_completion_tokens agree when
# both are given; continue_final_message needs a final assistant message.
CHAT_REQUEST["allOf"] = [
    _STREAM_RULE,
    _implies("top_logprobs", {"type": "integer"}, {"logprobs": {"const": True}}),
    _implies("continue_final_message", {"const": True},
             {"add_generation_prompt": {"enum": [False, None]}}, present=False),
]  # fmt: skip

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
        "usage": _object({"prompt_tokens": _INT, "completion_tokens": _INT, "cached_tokens": _INT},
                         ["prompt_tokens", "completion_tokens", "cached_tokens"]),
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


def sse_event(data: str, error: str, done: bool) -> Schema:
    """One server-sent event whose data is a JSON ``data`` object (or ``error`` after a failure
    mid-stream), and with ``done`` possibly the literal ``[DONE]`` that ends OpenAI streams.
    Like OpenAPI 3.2's ``itemSchema``: the fields of the event, the data's own schema inside."""
    json_data = {
        "type": "string",
        "contentMediaType": "application/json",
        "contentSchema": {"anyOf": [ref(data), ref(error)]},
    }
    return _object(
        {
            "data": {"anyOf": [json_data, {"const": "[DONE]"}]} if done else json_data,
            "event": _STR,
            "id": _STR,
            "retry": _INT,
        },
        ["data"],
    )


# Request fields bounded by --max-tokens-limit, which only the serving node knows.
_OUTPUT_LENGTHS = {
    "GenerateRequest": ("max_tokens",),
    "CompletionRequest": ("max_tokens",),
    "ChatCompletionRequest": ("max_tokens", "max_completion_tokens"),
}


def with_max_tokens_limit(doc: dict[str, Any], limit: int) -> dict[str, Any]:
    """``doc`` with a node's ``--max-tokens-limit`` as the maximum of every output length."""
    schemas = dict(doc["components"]["schemas"])
    for name, fields in _OUTPUT_LENGTHS.items():
        properties = dict(schemas[name]["properties"])
        for field in fields:
            properties[field] = {**properties[field], "maximum": limit}
        schemas[name] = {**schemas[name], "properties": properties}
    return {**doc, "components": {**doc["components"], "schemas": schemas}}


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
