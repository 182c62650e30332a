"""Parsing a ``POST /generate`` body into a typed request; every bad input is a 400 naming why.

The rules are the API's contract, so they live here in one place and are tested case by case.
A ``bool`` is never accepted where a number is asked for, although Python treats it as an int.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tinyserve.config import Config
from tinyserve.frontend.api_errors import invalid, too_long

MAX_STOP_STRINGS = 4
MAX_STOP_CHARS = 64
PRIORITY_RANGE = (-10, 10)
TEMPERATURE_MAX = 2.0
SEED_MAX = 2**32 - 1  # llama.cpp seeds are uint32
_TENANT = re.compile(r"[A-Za-z0-9._-]{1,64}")

FIELDS = frozenset(
    {
        "prompt",
        "max_tokens",
        "stream",
        "temperature",
        "top_p",
        "top_k",
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


def parse_generate(body: bytes, config: Config) -> GenerateRequest:
    """Parse and check a request body; raises a 400 ``ApiError`` on any violation."""
    data = _load_object(body)
    unknown = sorted(set(data) - FIELDS)
    if unknown:
        raise invalid(f"unknown field {unknown[0]!r}")
    return GenerateRequest(
        prompt=_prompt(data.get("prompt")),
        max_tokens=_max_tokens(data.get("max_tokens"), config),
        stream=_optional(data, "stream", _bool, False),
        temperature=_optional(data, "temperature", _temperature, 0.0),
        top_p=_optional(data, "top_p", _top_p, 1.0),
        top_k=_optional(data, "top_k", _top_k, 0),
        seed=_optional(data, "seed", _seed, None),
        stop=_optional(data, "stop", _stop, []),
        priority=_optional(data, "priority", _priority, 0),
        tenant=_optional(data, "tenant", _tenant, "default"),
        timeline=_optional(data, "timeline", _bool, False),
    )


def check_prompt_fits(prompt_tokens: int, max_tokens: int, n_ctx: int) -> None:
    """After tokenizing: an empty prompt, or one that cannot fit ``n_ctx``, is a 400."""
    if prompt_tokens == 0:
        raise invalid("'prompt' tokenizes to 0 tokens")
    if prompt_tokens + max_tokens > n_ctx:
        raise too_long(
            f"prompt_tokens ({prompt_tokens}) + max_tokens ({max_tokens}) exceeds "
            f"the context length ({n_ctx})"
        )


def _load_object(body: bytes) -> dict[str, Any]:
    try:
        data = json.loads(body)
    # RecursionError: a deeply nested body must be a 400, not a crash of the handler.
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise invalid(f"body is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise invalid("body must be a JSON object")
    return data


def _optional(
    data: dict[str, Any], name: str, check: Callable[[str, Any], Any], default: Any
) -> Any:
    """``check`` the field when present; JSON null means "use the default" (seed: "random")."""
    if name not in data or (data[name] is None and name != "seed"):
        return default
    return check(name, data[name])


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    # math.isfinite() overflows on huge ints; every int is finite anyway.
    return _is_int(value) or (isinstance(value, float) and math.isfinite(value))


def _prompt(value: Any) -> str:
    if value is None:
        raise invalid("'prompt' is required")
    if not isinstance(value, str):
        raise invalid("'prompt' must be a string")
    if not value:
        raise invalid("'prompt' must not be empty")
    return _encodable("prompt", value)


def _encodable(name: str, value: str) -> str:
    # JSON may carry lone surrogates (a \ud800 escape), which no UTF-8 encoder accepts later.
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise invalid(f"{name!r} is not valid Unicode: {exc.reason}") from exc
    return value


def _max_tokens(value: Any, config: Config) -> int:
    if value is None:
        return config.default_max_tokens
    if not _is_int(value):
        raise invalid("'max_tokens' must be an integer")
    if not 1 <= value <= config.max_tokens_limit:
        raise invalid(f"'max_tokens' must be between 1 and {config.max_tokens_limit}")
    return int(value)


def _bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise invalid(f"{name!r} must be a boolean")
    return value


def _temperature(name: str, value: Any) -> float:
    if not _is_number(value) or not 0.0 <= value <= TEMPERATURE_MAX:
        raise invalid(f"{name!r} must be a number between 0 and {TEMPERATURE_MAX:g}")
    return float(value)


def _top_p(name: str, value: Any) -> float:
    if not _is_number(value) or not 0.0 < value <= 1.0:
        raise invalid(f"{name!r} must be a number in (0, 1]")
    return float(value)


def _top_k(name: str, value: Any) -> int:
    if not _is_int(value) or value < 0:
        raise invalid(f"{name!r} must be an integer >= 0 (0: off)")
    return int(value)


def _seed(name: str, value: Any) -> int | None:
    if value is None:
        return None
    if not _is_int(value) or not 0 <= value <= SEED_MAX:
        raise invalid(f"{name!r} must be null or an integer between 0 and {SEED_MAX}")
    return int(value)


def _stop(name: str, value: Any) -> list[str]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
        raise invalid(f"{name!r} must be a string or a list of strings")
    if len(items) > MAX_STOP_STRINGS:
        raise invalid(f"{name!r} may hold at most {MAX_STOP_STRINGS} strings")
    if not all(1 <= len(s) <= MAX_STOP_CHARS for s in items):
        raise invalid(f"each {name!r} string must be 1 to {MAX_STOP_CHARS} characters")
    return [_encodable(name, s) for s in items]


def _priority(name: str, value: Any) -> int:
    low, high = PRIORITY_RANGE
    if not _is_int(value) or not low <= value <= high:
        raise invalid(f"{name!r} must be an integer between {low} and {high}")
    return int(value)


def _tenant(name: str, value: Any) -> str:
    if not isinstance(value, str) or not _TENANT.fullmatch(value):
        raise invalid(f"{name!r} must be 1 to 64 characters of A-Z, a-z, 0-9, '.', '_', '-'")
    return value
