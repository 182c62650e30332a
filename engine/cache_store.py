"""The prefix cache kept across restarts: written to ``--cache-dir`` at drain, read at start.

At the end of a drain every cached block still in cells is copied to the host tier too
(``PrefixCache.spill``) and the host tier is written out, up to ``--cache-dir-mb``: whole
prefixes first (a block is written only after its parent), shallow blocks before deep ones
(a system prompt serves more requests than one conversation's tail), the most recently used
first among equals. At start the files that match are read back into the host tier, and the
first request that needs a prefix restores it from there as after any eviction.

KV bytes are only valid for the model file, the llama.cpp build and the KV layout that wrote
them, so every file carries a ``StoreKey`` (the model file's sha256, ``llama_cpp.__version__``,
the context's size, block size, K/V types and flash-attention mode) and a sha256 of its
payload; a file whose key differs, whose checksum fails, that is truncated or that does not
parse is skipped with one log line. Files are written to a temporary name and renamed, so a
crash mid-write leaves the previous file or none, never half of one. The format is
``MAGIC``, a little-endian u32 header length, the header (JSON), then the payload (msgpack:
``[parent key, tokens, kv, depth]`` per block).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import struct
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import msgpack

from tinyserve.config import Config
from tinyserve.engine.host_cache import ROOT, HostBlock, HostCache
from tinyserve.engine.prefix_cache import PrefixCache
from tinyserve.engine.runtime import LlamaRuntime, llama_cpp_version
from tinyserve.logs import fields

log = logging.getLogger(__name__)

MAGIC = b"TSPC"
FORMAT = 1
FILE_BYTES = 32 * 2**20  # payload per file: a damaged file loses at most this much
_LENGTH = struct.Struct("<I")
_PREFIX = "prefix-"
_SUFFIX = ".bin"


class CacheFileError(ValueError):
    """A cache file that cannot be used; the message says why."""


@dataclass(frozen=True)
class StoreKey:
    """What KV bytes depend on besides the tokens: a file is read only under the same key."""

    model_sha256: str
    llama_cpp: str
    n_ctx: int
    block_size: int
    type_k: int
    type_v: int
    flash_attn: int

    @property
    def digest(self) -> str:
        """A short name for the key, in file names (the header holds the key itself)."""
        text = json.dumps(asdict(self), sort_keys=True).encode()
        return hashlib.sha256(text).hexdigest()[:16]


def model_sha256(path: Path) -> str:
    """The model file's sha256: the whole file, once per start (~0.3 s for the default
    98 MB model), since a re-quantised file of the same size and name holds other weights."""
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def choose(blocks: Iterable[HostBlock], limit: int) -> list[HostBlock]:
    """What to write within ``limit`` bytes, in writing order: by depth, the most recently
    used first among equals (``blocks`` comes least recently used first), and a block only
    if its parent is written too."""
    ordered = list(blocks)
    recency = {id(b): i for i, b in enumerate(ordered)}
    chosen: list[HostBlock] = []
    keys, total = {ROOT}, 0
    for block in sorted(ordered, key=lambda b: (b.depth, -recency[id(b)])):
        if block.parent in keys and total + block.size <= limit:
            chosen.append(block)
            keys.add(block.key)
            total += block.size
    return chosen


def write(directory: Path, key: StoreKey, blocks: list[HostBlock]) -> list[Path]:
    """Write ``blocks`` (already chosen) as files of at most ``FILE_BYTES`` of payload each,
    replacing every cache file there before (of this key or any other); returns the files."""
    directory.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for index, chunk in enumerate(_chunks(blocks)):
        path = directory / f"{_PREFIX}{key.digest}-{index:04d}{_SUFFIX}"
        _write_file(path, key, chunk)
        written.append(path)
    for stale in set(directory.glob(f"{_PREFIX}*{_SUFFIX}")) - set(written):
        stale.unlink(missing_ok=True)
    return written


def _chunks(blocks: list[HostBlock]) -> Iterable[list[HostBlock]]:
    chunk: list[HostBlock] = []
    size = 0
    for block in blocks:
        if chunk and size + len(block.kv) > FILE_BYTES:
            yield chunk
            chunk, size = [], 0
        chunk.append(block)
        size += len(block.kv)
    if chunk:
        yield chunk


def _write_file(path: Path, key: StoreKey, blocks: list[HostBlock]) -> None:
    payload = msgpack.packb([[b.parent, list(b.tokens), b.kv, b.depth] for b in blocks])
    header = {
        "format": FORMAT,
        "key": asdict(key),
        "blocks": len(blocks),
        "payload_bytes": len(payload),
        "payload_sha256": hashlib.sha256(payload).hexdigest(),
    }
    head = json.dumps(header, sort_keys=True).encode()
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with tmp.open("wb") as f:
        f.write(MAGIC + _LENGTH.pack(len(head)) + head)
        f.write(payload)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read(directory: Path, key: StoreKey) -> list[HostBlock]:
    """Every block in the usable cache files there, in writing order; each file that cannot
    be used is skipped with one warning naming it and why."""
    blocks: list[HostBlock] = []
    for path in sorted(directory.glob(f"{_PREFIX}*{_SUFFIX}")):
        try:
            blocks += read_file(path, key)
        except (OSError, CacheFileError) as exc:
            log.warning("prefix cache file skipped", extra=fields(path=str(path), why=str(exc)))
    return blocks


def read_file(path: Path, key: StoreKey) -> list[HostBlock]:
    """The blocks of one file; ``CacheFileError`` if it is not one written under ``key``
    or is damaged in any way."""
    data = path.read_bytes()
    header, payload = _split(data)
    if header.get("format") != FORMAT:
        raise CacheFileError(f"format {header.get('format')!r}, not {FORMAT}")
    if header.get("key") != asdict(key):
        raise CacheFileError("written for another model, llama.cpp or context settings")
    if len(payload) != header.get("payload_bytes"):
        raise CacheFileError(f"truncated: {len(payload)} of {header.get('payload_bytes')} bytes")
    if hashlib.sha256(payload).hexdigest() != header.get("payload_sha256"):
        raise CacheFileError("checksum mismatch")
    return _blocks(payload, key.block_size)


def _split(data: bytes) -> tuple[dict[str, Any], bytes]:
    start = len(MAGIC) + _LENGTH.size
    if len(data) < start or not data.startswith(MAGIC):
        raise CacheFileError("not a prefix cache file (magic)")
    (length,) = _LENGTH.unpack_from(data, len(MAGIC))
    try:
        header = json.loads(data[start : start + length])
    except ValueError as exc:
        raise CacheFileError(f"header: {exc}") from None
    if not isinstance(header, dict):
        raise CacheFileError("header is not an object")
    return header, data[start + length :]


def _blocks(payload: bytes, block_size: int) -> list[HostBlock]:
    try:
        entries = msgpack.unpackb(payload)
        blocks = [HostBlock(p, tuple(t), kv, d) for p, t, kv, d in entries]
    except (ValueError, TypeError) as exc:  # msgpack's errors are ValueErrors
        raise CacheFileError(f"payload: {exc}") from None
    for block in blocks:
        if not (
            isinstance(block.parent, bytes)
            and isinstance(block.kv, bytes)
            and isinstance(block.depth, int)
            and len(block.tokens) == block_size
            and all(isinstance(t, int) and 0 <= t < 2**31 for t in block.tokens)
        ):
            raise CacheFileError("payload: a block of the wrong shape")
    return blocks


def load_into(host: HostCache, blocks: list[HostBlock]) -> int:
    """Put ``blocks`` (in writing order) into the host tier so that, should it be smaller
    than the files, it keeps the first ones written (shallow, recently used); returns how
    many it holds afterwards."""
    for block in reversed(blocks):
        host.put(block)
    return len(host)


class KeptCache:
    """``--cache-dir`` for one engine: its key worked out once at start, the files read into
    the host tier then, and the cache written at the end of a drain."""

    def __init__(self, directory: Path, key: StoreKey, limit: int, cache: PrefixCache) -> None:
        self.directory = directory
        self.key = key
        self.limit = limit
        self.cache = cache

    @classmethod
    def open(
        cls, config: Config, runtime: LlamaRuntime, cache: PrefixCache | None
    ) -> KeptCache | None:
        """None without ``--cache-dir`` (config refuses one without the host tier)."""
        if not config.cache_dir or cache is None or cache.host is None:
            return None
        layout = runtime.kv_layout
        key = StoreKey(
            model_sha256(runtime.spec.model_path),
            llama_cpp_version(),
            runtime.n_ctx,
            config.block_size,
            layout["type_k"],
            layout["type_v"],
            layout["flash_attn"],
        )
        return cls(Path(config.cache_dir), key, config.cache_dir_mb * 2**20, cache)

    def load(self) -> int:
        """Read the matching files into the host tier; returns the blocks it holds."""
        assert self.cache.host is not None
        blocks = read(self.directory, self.key) if self.directory.is_dir() else []
        held = load_into(self.cache.host, blocks)
        self.cache.stats.host_bytes = self.cache.host.bytes
        log.info(
            "prefix cache read",
            extra=fields(dir=str(self.directory), blocks=held, key=self.key.digest),
        )
        return held

    def save(self) -> int:
        """Write the cache (cells and host tier) out; returns the blocks written. A disk
        that fails is logged, not raised: the drain itself went well."""
        assert self.cache.host is not None
        self.cache.spill()
        chosen = choose(self.cache.host.blocks(), self.limit)
        try:
            files = write(self.directory, self.key, chosen)
        except OSError as exc:
            log.error(
                "prefix cache not written", extra=fields(dir=str(self.directory), why=str(exc))
            )
            return 0
        log.info(
            "prefix cache written",
            extra=fields(dir=str(self.directory), blocks=len(chosen), files=len(files)),
        )
        return len(chosen)
