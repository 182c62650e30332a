"""Parsing a ``POST /generate`` body into a typed request; every bad input is a 400 naming why.

The rules are the API's contract, so they live here in one place and are tested case by case;
the ``check_*`` field checkers are shared with the OpenAI surface (``openai_schema``).
A ``bool`` is never accepted where a number is asked for, although Python treats it as an int;
an integral float (``2.0``) is accepted where an integer is.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import hdrs, web

from tinyserve.config import Config
from tinyserve.frontend.api_errors import (
    UNSUPPORTED_MEDIA_TYPE,
    ApiError,
    invalid,
    too_long,
)

MAX_STOP_STRINGS = 4
MAX_STOP_CHARS = 64
PRIORITY_RANGE = (-10, 10)
TEMPERATURE_MAX = 2.0
PENALTY_RANGE = (-2.0, 2.0)
SEED_MAX = 2**32 - 1  # llama.cpp seeds are uint32
TOP_K_MAX = 2**31 - 1  # llama.cpp's top_k is an int32 (and msgpack stops at 64 bits)
TENANT_PATTERN = re.compile(r"[A-Za-z0-9._-]{1,64}")

FIELDS = frozenset(
    {
        "prompt",
        "max_tokens",
        "stream",
        "temperature",
        "top_p",
        "top_k",
        "ignore_eos",
        "seed",
        "stop",
        "priority",
        "tenant",
        "timeline",
    }
)


@dataclass(frozen=True)
class GenerateRequest:
    """A ``/generate`` request that follows the API (not yet tokenized)."""

    prompt: str
    max_tokens: int
    stream: bool = False
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    priority: int = 0
    tenant: str = "default"
    timeline: bool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logprobs: int = -1  # alternatives per token to report; -1: no logprobs
    ignore_eos: bool = False


def parse_generate(body: bytes, config: Config) -> GenerateRequest:
    """Parse and check a request body; raises a 400 ``ApiError`` on any violation."""
    data = load_object(body)
    unknown = sorted(set(data) - FIELDS)
    if unknown:
        raise invalid(f"unknown field {unknown[0]!r}", unknown[0])
    return GenerateRequest(
        prompt=check_prompt(data.get("prompt")),
        max_tokens=check_max_tokens("max_tokens", data.get("max_tokens"), config),
        timeline=optional(data, "timeline", check_bool, False),
        **common_fields(data),
    )


def common_fields(data: dict[str, Any], *, temperature: float = 0.0) -> dict[str, Any]:
    """The sampling and scheduling fields every surface shares, checked: keyword arguments of
    ``GenerateRequest``. ``temperature`` is the surface's default (OpenAI's is 1)."""
    return {
        "stream": optional(data, "stream", check_bool, False),
        "temperature": optional(data, "temperature", check_temperature, temperature),
        "top_p": optional(data, "top_p", check_top_p, 1.0),
        "top_k": optional(data, "top_k", check_top_k, 0),
        "ignore_eos": optional(data, "ignore_eos", check_bool, False),
        "seed": optional(data, "seed", check_seed, None),
        "stop": optional(data, "stop", check_stop, []),
        "priority": optional(data, "priority", check_priority, 0),
        "tenant": optional(data, "tenant", check_tenant, "default"),
    }


def check_prompt_fits(prompt_tokens: int, max_tokens: int, n_ctx: int) -> None:
    """After tokenizing: an empty prompt, or one that cannot fit ``n_ctx``, is a 400."""
    if prompt_tokens == 0:
        raise invalid("'prompt' tokenizes to 0 tokens", "prompt")
    if prompt_tokens + max_tokens > n_ctx:
        raise too_long(
            f"prompt_tokens ({prompt_tokens}) + max_tokens ({max_tokens}) exceeds "
            f"the context length ({n_ctx})"
        )


def check_token_ids(prompt_ids: list[int], n_vocab: int) -> None:
    """A prompt given as token ids must name tokens of the served model."""
    bad = next((t for t in prompt_ids if t >= n_vocab), None)
    if bad is not None:
        raise invalid(
            f"'prompt' token id {bad} is not in the vocabulary (size {n_vocab})", "prompt"
        )


async def json_body(request: web.Request) -> bytes:
    """The body of a request that says it is JSON, or says nothing; any other Content-Type is a
    415. Browsers send forms and text/plain across sites without asking (no CORS preflight), so
    a JSON-only API refusing them cannot be driven by a page the user happens to visit."""
    if hdrs.CONTENT_TYPE in request.headers:
        media = request.content_type.lower()
        if media != "application/json" and not (
            media.startswith("application/") and media.endswith("+json")
        ):
            message = f"Content-Type must be application/json, not {media!r}"
            raise ApiError(415, UNSUPPORTED_MEDIA_TYPE, message)
    return await request.read()


def load_object(body: bytes) -> dict[str, Any]:
    try:
        data = json.loads(body, object_pairs_hook=_unique_keys)
    # RecursionError: a deeply nested body must be a 400, not a crash of the handler.
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise invalid(f"body is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise invalid("body must be a JSON object")
    return data


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # A key given twice may be read as its first value by a proxy that checked it and as its
    # last one here (Python's default); refusing the body leaves no such gap (RFC 7493 2.3).
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            raise ValueError(f"duplicate key {key!r}")
        seen.add(key)
    return dict(pairs)


def optional(
    data: dict[str, Any], name: str, check: Callable[[str, Any], Any], default: Any
) -> Any:
    """``check`` the field when present; JSON null means "use the default" (seed: "random")."""
    if name not in data or (data[name] is None and name != "seed"):
        return default
    return check(name, data[name])


def is_int(value: Any) -> bool:
    # JSON has one number type: 2.0 is the integer 2 (JSON Schema agrees, and so do clients
    # that compute a count by division). Callers convert with int().
    if isinstance(value, float):
        return value.is_integer()
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    # math.isfinite() overflows on huge ints; every int is finite anyway.
    return is_int(value) or (isinstance(value, float) and math.isfinite(value))


def check_prompt(value: Any) -> str:
    """A required, non-empty prompt string."""
    if value is None:
        raise invalid("'prompt' is required", "prompt")
    if not isinstance(value, str):
        raise invalid("'prompt' must be a string", "prompt")
    if not value:
        raise invalid("'prompt' must not be empty", "prompt")
    return encodable("prompt", value)


def encodable(name: str, value: str) -> str:
    # JSON may carry lone surrogates (a \ud800 escape), which no UTF-8 encoder accepts later.
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise invalid(f"{name!r} is not valid Unicode: {exc.reason}", name) from exc
    return value


def check_max_tokens(name: str, value: Any, config: Config) -> int:
    """An output length within the configured limit; None is the configured default."""
    if value is None:
        return config.default_max_tokens
    if not is_int(value):
        raise invalid(f"{name!r} must be an integer", name)
    if not 1 <= value <= config.max_tokens_limit:
        raise invalid(f"{name!r} must be between 1 and {config.max_tokens_limit}", name)
    return int(value)


def check_bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise invalid(f"{name!r} must be a boolean", name)
    return value


def check_temperature(name: str, value: Any) -> float:
    if not is_number(value) or not 0.0 <= value <= TEMPERATURE_MAX:
        raise invalid(f"{name!r} must be a number between 0 and {TEMPERATURE_MAX:g}", name)
    return float(value)


def check_top_p(name: str, value: Any) -> float:
    if not is_number(value) or not 0.0 < value <= 1.0:
        raise invalid(f"{name!r} must be a number in (0, 1]", name)
    return float(value)


def check_top_k(name: str, value: Any) -> int:
    if not is_int(value) or not 0 <= value <= TOP_K_MAX:
        raise invalid(f"{name!r} must be an integer between 0 (off) and {TOP_K_MAX}", name)
    return int(value)


def check_seed(name: str, value: Any) -> int | None:
    if value is None:
        return None
    if not is_int(value) or not 0 <= value <= SEED_MAX:
        raise invalid(f"{name!r} must be null or an integer between 0 and {SEED_MAX}", name)
    return int(value)


def check_stop(name: str, value: Any) -> list[str]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
        raise invalid(f"{name!r} must be a string or a list of strings", name)
    if len(items) > MAX_STOP_STRINGS:
        raise invalid(f"{name!r} may hold at most {MAX_STOP_STRINGS} strings", name)
    if not all(1 <= len(s) <= MAX_STOP_CHARS for s in items):
        raise invalid(f"each {name!r} string must be 1 to {MAX_STOP_CHARS} characters", name)
    return [encodable(name, s) for s in items]


def check_priority(name: str, value: Any) -> int:
    low, high = PRIORITY_RANGE
    if not is_int(value) or not low <= value <= high:
        raise invalid(f"{name!r} must be an integer between {low} and {high}", name)
    return int(value)


def check_tenant(name: str, value: Any) -> str:
    if not isinstance(value, str) or not TENANT_PATTERN.fullmatch(value):
        raise invalid(f"{name!r} must be 1 to 64 characters of A-Z, a-z, 0-9, '.', '_', '-'", name)
    return value


def check_penalty(name: str, value: Any) -> float:
    low, high = PENALTY_RANGE
    if not is_number(value) or not low <= value <= high:
        raise invalid(f"{name!r} must be a number between {low:g} and {high:g}", name)
    return float(value)
