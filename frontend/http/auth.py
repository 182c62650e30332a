"""API keys: ``Authorization: Bearer <key>`` (or ``x-api-key: <key>``, as Anthropic's clients
send it) on every route but the open ones.

Keys come from ``--api-key`` (repeatable; ``TINYSERVE_API_KEY=a,b``) and ``--api-key-file``
(one key per line, ``#`` comments and blank lines ignored). No key configured: no check.
A presented key is hashed and compared with every configured key's hash in constant time,
with no early exit, so neither timing nor the reply tells which key (or which part) was wrong.
A refused request gets a 401 with ``WWW-Authenticate: Bearer`` in the error shape of its path
(the check itself is ``http.middlewares``').
"""

from __future__ import annotations

import hashlib
import hmac

from aiohttp import web

from tinyserve.config import Config
from tinyserve.errors import TinyServeError
from tinyserve.frontend.models.errors import ApiError

# Probes and the API description stay reachable without a key: they reveal no data.
OPEN_PATHS = frozenset({"/health", "/ready", "/openapi.json"})
# The dashboard's page and files hold no data; the feed they read (/v1/events) needs a key.
OPEN_PREFIX = "/dashboard"
METRICS_PATH = "/metrics"
INVALID_API_KEY = "invalid_api_key"
UNAUTHORIZED = "a valid API key is required: Authorization: Bearer <key>, or x-api-key: <key>"
API_KEY_HEADER = "x-api-key"


class ApiKeys:
    """The accepted keys, kept only as SHA-256 digests."""

    def __init__(self, keys: list[str] | tuple[str, ...]) -> None:
        self._digests = [_digest(key) for key in keys]

    @classmethod
    def of_config(cls, config: Config) -> ApiKeys:
        """``--api-key`` values plus the lines of ``--api-key-file``; a file that cannot be
        read or holds no key is a start-up error (a typo must not turn authentication off)."""
        keys = list(config.api_key)
        if config.api_key_file is not None:
            keys += read_key_file(config.api_key_file)
        return cls(keys)

    @property
    def enabled(self) -> bool:
        return bool(self._digests)

    def accepts(self, presented: str) -> bool:
        """Whether ``presented`` is one of the keys; the same work whichever matches."""
        digest = _digest(presented)
        found = False
        for known in self._digests:
            found |= hmac.compare_digest(digest, known)
        return found


def read_key_file(path: str) -> list[str]:
    """The keys listed in ``path``: one per line, ``#`` comments and blank lines skipped."""
    try:
        with open(path, encoding="utf-8") as file:
            lines = file.read().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise TinyServeError(f"cannot read --api-key-file {path}: {exc}") from exc
    keys = [line.strip() for line in lines]
    keys = [key for key in keys if key and not key.startswith("#")]
    if not keys:
        raise TinyServeError(f"--api-key-file {path} holds no key")
    if any(any(c.isspace() for c in key) for key in keys):
        raise TinyServeError(f"--api-key-file {path}: a key may not contain spaces")
    return keys


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8", "surrogateescape")).digest()


def bearer_token(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header (scheme case-insensitive)."""
    if header is None:
        return None
    scheme, _, token = header.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    return token


def presented_key(request: web.Request) -> str | None:
    """The key ``request`` presents: its bearer token, else its ``x-api-key`` header."""
    token = bearer_token(request.headers.get("Authorization"))
    if token is None:
        token = request.headers.get(API_KEY_HEADER, "").strip() or None
    return token


def unauthorized() -> ApiError:
    """The one 401 for a missing, malformed or unknown key."""
    return ApiError(401, INVALID_API_KEY, UNAUTHORIZED, headers={"WWW-Authenticate": "Bearer"})


def is_open(path: str) -> bool:
    """Whether ``path`` never needs a key (``/metrics`` aside, which a flag decides)."""
    return path in OPEN_PATHS or path == OPEN_PREFIX or path.startswith(OPEN_PREFIX + "/")


def needs_key(path: str, config: Config) -> bool:
    """Every path needs a key except the probes, the API document and (by flag) metrics."""
    if is_open(path):
        return False
    return path != METRICS_PATH or config.metrics_auth
