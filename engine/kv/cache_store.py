"""The prefix cache kept across restarts: written to ``--cache-dir`` at drain, read at start.

At the end of a drain the prefix cache's blocks (``HostCache``: every finished request's
full blocks are there already) are written out, up to ``--cache-dir-mb``, shallow blocks
first (a system prompt serves more requests than one conversation's tail), so a block is
always written after its parent. At start the files that match are read back into the cache,
and the first request that needs a prefix has it written into its slot from there; such hits
are counted as the ``disk`` tier.

KV bytes are only valid for the model file, the llama.cpp build and the KV layout that wrote
them, so every file carries a ``StoreKey`` (the model file's sha256, ``llama_cpp.__version__``,
the block size, the saved state's layout and K/V types and flash-attention mode) and a sha256
of its payload; a file whose key differs, whose checksum fails, that is truncated or that does
not parse is skipped with one log line. The number of slots is not part of it: a block is
the bytes of its cells, written into whichever slot needs it. Files are written to a temporary
name and renamed, so a crash mid-write leaves the previous file or none, never half of one.
The format is
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
from collections.abc import Sequence as Tokens
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import msgpack

from tinyserve.config import Config
from tinyserve.engine.kv.host_cache import HostCache
from tinyserve.engine.kv.kv_space import KvSpace
from tinyserve.engine.kv.kv_state import StateLayout
from tinyserve.engine.runtime.runtime import LlamaRuntime, llama_cpp_version
from tinyserve.logs import fields

log = logging.getLogger(__name__)

MAGIC = b"TSPC"
FORMAT = 2  # 1: blocks as llama.cpp saved one block's sequence, before KV per slot
ROOT = b""  # the key "before" a prefix's first block
KEY_BYTES = 16
FILE_BYTES = 32 * 2**20  # payload per file: a damaged file loses at most this much
_LENGTH = struct.Struct("<I")
_PREFIX = "prefix-"
_SUFFIX = ".bin"


class CacheFileError(ValueError):
    """A cache file that cannot be used; the message says why."""


def block_key(parent: bytes, tokens: Tokens[int]) -> bytes:
    """The key of the block of ``tokens`` that follows the block keyed ``parent``: a hash
    chain, so a key names the whole prefix its KV was computed after."""
    packed = struct.pack(f"<{len(tokens)}i", *tokens)
    return hashlib.blake2b(parent + packed, digest_size=KEY_BYTES).digest()


@dataclass(frozen=True)
class StoredBlock:
    """One block as a file holds it: below the block keyed ``parent`` (ROOT for a prefix's
    first), its tokens, its KV (a ``HostCache`` arena row) and its depth in blocks."""

    parent: bytes
    tokens: tuple[int, ...]
    kv: bytes
    depth: int

    @property
    def key(self) -> bytes:
        return block_key(self.parent, self.tokens)

    @property
    def size(self) -> int:
        return len(self.kv) + 8 * len(self.tokens)


@dataclass(frozen=True)
class StoreKey:
    """What KV bytes depend on besides the tokens: a file is read only under the same key."""

    model_sha256: str
    llama_cpp: str
    block_size: int
    layout: str  # a digest of the saved state's layout (record sizes and headers)
    type_k: int
    type_v: int
    flash_attn: int

    @property
    def digest(self) -> str:
        """A short name for the key, in file names (the header holds the key itself)."""
        text = json.dumps(asdict(self), sort_keys=True).encode()
        return hashlib.sha256(text).hexdigest()[:16]


def layout_digest(layout: StateLayout) -> str:
    """What of the saved state's layout a block's bytes depend on, as a short digest."""
    parts = [layout.cell_record.to_bytes(4, "little"), layout.middle]
    parts += [r.header for r in layout.records]
    return hashlib.sha256(b"".join(parts)).hexdigest()[:32]


def model_sha256(path: Path) -> str:
    """The model file's sha256: the whole file, once per start (~0.3 s for the default
    98 MB model), since a re-quantised file of the same size and name holds other weights."""
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def choose(blocks: Iterable[StoredBlock], limit: int) -> list[StoredBlock]:
    """What to write within ``limit`` bytes, in writing order: by depth (stable, so the
    caller's order among equals stands), and a block only if its parent is written too."""
    chosen: list[StoredBlock] = []
    keys, total = {ROOT}, 0
    for block in sorted(blocks, key=lambda b: b.depth):
        if block.parent in keys and total + block.size <= limit:
            chosen.append(block)
            keys.add(block.key)
            total += block.size
    return chosen


def write(directory: Path, key: StoreKey, blocks: list[StoredBlock]) -> list[Path]:
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


def _chunks(blocks: list[StoredBlock]) -> Iterable[list[StoredBlock]]:
    chunk: list[StoredBlock] = []
    size = 0
    for block in blocks:
        if chunk and size + len(block.kv) > FILE_BYTES:
            yield chunk
            chunk, size = [], 0
        chunk.append(block)
        size += len(block.kv)
    if chunk:
        yield chunk


def _write_file(path: Path, key: StoreKey, blocks: list[StoredBlock]) -> None:
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


def read(directory: Path, key: StoreKey) -> list[StoredBlock]:
    """Every block in the usable cache files there, in writing order; each file that cannot
    be used is skipped with one warning naming it and why."""
    blocks: list[StoredBlock] = []
    for path in sorted(directory.glob(f"{_PREFIX}*{_SUFFIX}")):
        try:
            blocks += read_file(path, key)
        except (OSError, CacheFileError) as exc:
            log.warning("prefix cache file skipped", extra=fields(path=str(path), why=str(exc)))
    return blocks


def read_file(path: Path, key: StoreKey) -> list[StoredBlock]:
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


def _blocks(payload: bytes, block_size: int) -> list[StoredBlock]:
    try:
        entries = msgpack.unpackb(payload)
        blocks = [StoredBlock(p, tuple(t), kv, d) for p, t, kv, d in entries]
    except (ValueError, TypeError) as exc:  # msgpack's errors are ValueErrors
        raise CacheFileError(f"payload: {exc}") from None
    for block in blocks:
        if not (
            isinstance(block.parent, bytes)
            and isinstance(block.kv, bytes)
            and isinstance(block.depth, int)
            and 0 < len(block.tokens) <= block_size
            and all(isinstance(t, int) and 0 <= t < 2**31 for t in block.tokens)
        ):
            raise CacheFileError("payload: a block of the wrong shape")
    return blocks


class KeptCache:
    """``--cache-dir`` for one engine: its key worked out once at start, the files read into
    the prefix cache then, and the cache written at the end of a drain."""

    def __init__(self, directory: Path, key: StoreKey, limit: int, kv: KvSpace) -> None:
        self.directory = directory
        self.key = key
        self.limit = limit
        self.kv = kv  # its cache, which a failure may replace, is looked up at each use

    @classmethod
    def open(cls, config: Config, runtime: LlamaRuntime, kv: KvSpace) -> KeptCache | None:
        """None without ``--cache-dir`` or without a prefix cache to keep."""
        if not config.cache_dir or kv.cache is None:
            return None
        types = runtime.kv_types
        key = StoreKey(
            model_sha256(runtime.spec.model_path),
            llama_cpp_version(),
            config.block_size,
            layout_digest(kv.cache.layout),
            types["type_k"],
            types["type_v"],
            types["flash_attn"],
        )
        return cls(Path(config.cache_dir), key, config.cache_dir_mb * 2**20, kv)

    def load(self) -> int:
        """Read the matching files into the prefix cache; returns the blocks it took."""
        cache = self.kv.cache
        if cache is None:
            return 0
        blocks = read(self.directory, self.key) if self.directory.is_dir() else []
        held = load_into(cache, blocks)
        log.info(
            "prefix cache read",
            extra=fields(dir=str(self.directory), blocks=held, key=self.key.digest),
        )
        return held

    def save(self) -> int:
        """Write the prefix cache out; returns the blocks written. A disk that fails is
        logged, not raised: the drain itself went well."""
        cache = self.kv.cache
        if cache is None:
            return 0
        chosen = choose(stored_blocks(cache), self.limit)
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


def stored_blocks(cache: HostCache) -> list[StoredBlock]:
    """Every block (and tail) of ``cache`` as a file holds it, shallow ones first."""
    bs, tree, blocks = cache.block_size, cache.tree, []
    keys: dict[int, bytes] = {}
    for row in cache.held():
        path, depth = tree.path_tokens(row), tree.depth(row)
        parent = keys[tree.match(path[: depth * bs]).block_ids[-1]] if depth else ROOT
        block = StoredBlock(parent, tuple(path[depth * bs :]), cache.arena[row].tobytes(), depth)
        keys[row] = block.key
        blocks.append(block)
    return blocks


def load_into(cache: HostCache, blocks: list[StoredBlock]) -> int:
    """Put ``blocks`` (in writing order: parents first) into ``cache`` below their parents,
    while it has free rows; returns how many it took."""
    rows: dict[bytes, int] = {ROOT: -1}
    for block in blocks:
        parent = rows.get(block.parent)
        if parent is None:
            continue  # its parent was not taken
        row = cache.adopt(parent, block.tokens, block.kv, from_disk=True)
        if row >= 0:
            rows[block.key] = row
    return len(rows) - 1
