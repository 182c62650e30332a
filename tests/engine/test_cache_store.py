"""Cache files: what is written, what is read back, and every way a file is refused."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import pytest

from tinyserve.engine import cache_store
from tinyserve.engine.cache_store import StoreKey, choose, read, write
from tinyserve.engine.host_cache import ROOT, HostBlock, HostCache, chain_keys

BLOCK = 4
KEY = StoreKey("ab" * 32, "0.3.36", 1024, BLOCK, 1, 1, -1)


def chain(tokens: list[int], kv: bytes = b"kv") -> list[HostBlock]:
    blocks, parent = [], ROOT
    for depth, key in enumerate(chain_keys(tokens, BLOCK)):
        piece = tuple(tokens[depth * BLOCK : (depth + 1) * BLOCK])
        blocks.append(HostBlock(parent, piece, kv + bytes([depth]), depth))
        parent = key
    return blocks


BLOCKS = chain(list(range(1, 13))) + chain([7, 7, 7, 7, 8, 8, 8, 8])


def skipped(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.getMessage() == "prefix cache file skipped"]


def test_what_is_written_is_read_back(tmp_path: Path) -> None:
    files = write(tmp_path, KEY, BLOCKS)
    assert len(files) == 1 and not list(tmp_path.glob(".*"))  # no temporary file left
    assert read(tmp_path, KEY) == BLOCKS


def test_large_caches_are_split_and_old_files_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "prefix-0000000000000000-0000.bin").write_bytes(b"another key's")
    monkeypatch.setattr(cache_store, "FILE_BYTES", 5)
    assert len(write(tmp_path, KEY, BLOCKS)) == len(BLOCKS)  # 3 bytes of KV each
    assert read(tmp_path, KEY) == BLOCKS
    assert len(write(tmp_path, KEY, BLOCKS[:2])) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        f"prefix-{KEY.digest}-{i:04d}.bin" for i in range(2)
    ]


def damage_flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x01
    path.write_bytes(bytes(data))


def damage_truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-5])


def damage_header(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:12])


def damage_magic(path: Path) -> None:
    path.write_bytes(b"XXXX" + path.read_bytes()[4:])


@pytest.mark.parametrize(
    ("damage", "why"),
    [
        (damage_flip, "checksum mismatch"),
        (damage_truncate, "truncated"),
        (damage_header, "header"),
        (damage_magic, "magic"),
    ],
)
def test_a_damaged_file_is_skipped_with_one_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: object, why: str
) -> None:
    first, second = write(tmp_path, KEY, BLOCKS[:3]), None
    assert callable(damage)
    damage(first[0])
    second = write(tmp_path / "other", KEY, BLOCKS[3:])[0]
    second.rename(tmp_path / f"prefix-{KEY.digest}-0001.bin")
    with caplog.at_level(logging.WARNING):
        assert read(tmp_path, KEY) == BLOCKS[3:]  # the good file still counts
    [line] = skipped(caplog)
    assert why in line.fields["why"]  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "field", ["model_sha256", "llama_cpp", "n_ctx", "block_size", "type_k", "flash_attn"]
)
def test_a_file_for_another_model_or_settings_is_skipped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, field: str
) -> None:
    write(tmp_path, KEY, BLOCKS)
    value = getattr(KEY, field)
    other = dataclasses.replace(
        KEY, **{field: value + value if isinstance(value, str) else value + 1}
    )
    with caplog.at_level(logging.WARNING):
        assert read(tmp_path, other) == []
    [line] = skipped(caplog)
    assert "another model" in line.fields["why"]  # type: ignore[attr-defined]


def test_choose_keeps_whole_prefixes_within_the_bound() -> None:
    deep = chain(list(range(1, 21)))  # 5 blocks
    size = deep[0].size
    assert choose(deep, 3 * size) == deep[:3]
    assert choose(deep[1:], 10 * size) == []  # no parent: useless, not written
    lru = chain([5, 5, 5, 5]) + chain([6, 6, 6, 6])  # least recently used first
    assert choose(lru, size) == lru[1:]  # the most recent of equal depth


def test_loading_a_small_host_tier_keeps_the_first_written(tmp_path: Path) -> None:
    deep = chain(list(range(1, 21)))
    host = HostCache(2 * deep[0].size, BLOCK)
    assert cache_store.load_into(host, deep) == 2
    assert host.run(list(range(1, 21)), 0, ROOT, 5) == deep[:2]
