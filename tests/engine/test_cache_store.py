"""Cache files: what is written, what is read back, every way a file is refused, and the
prefix cache's blocks going out to disk and back in."""

from __future__ import annotations

import dataclasses
import logging
import struct
from pathlib import Path

import pytest

from tinyserve.engine.core import EngineCore
from tinyserve.engine.kv import cache_store
from tinyserve.engine.kv.cache_store import (
    ROOT,
    KeptCache,
    StoredBlock,
    StoreKey,
    block_key,
    choose,
    load_into,
    read,
    stored_blocks,
    write,
)
from tinyserve.engine.kv.host_cache import TIER_DISK, HostCache
from tinyserve.engine.kv.kv_state import Record, StateLayout
from tinyserve.engine.runtime.runtime import LlamaRuntime

from .conftest import core_config
from .test_core import Driver

BLOCK = 4
KEY = StoreKey("ab" * 32, "0.3.36", BLOCK, "cd" * 16, 1, 1, -1)
# A state layout of 12-byte cell records and one 8-byte K row a cell: 80-byte blocks.
LAYOUT = StateLayout(1, 12, struct.pack("<II", 0, 1), (Record(struct.pack("<iQ", 1, 8), 1, 8),))


def chain(tokens: list[int], kv: bytes = b"kv") -> list[StoredBlock]:
    """The blocks of ``tokens`` (a partial last one as a tail), each with KV named after it."""
    blocks, parent = [], ROOT
    for depth in range(-(-len(tokens) // BLOCK)):
        piece = tuple(tokens[depth * BLOCK : (depth + 1) * BLOCK])
        blocks.append(StoredBlock(parent, piece, kv + bytes([depth]), depth))
        parent = block_key(parent, piece)
    return blocks


BLOCKS = chain(list(range(1, 13))) + chain([7, 7, 7, 7, 8, 8, 8, 8])


def skipped(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.getMessage() == "prefix cache file skipped"]


def test_a_key_names_the_whole_prefix() -> None:
    a, b = chain([1, 2, 3, 4, 5, 6, 7, 8]), chain([9, 2, 3, 4, 5, 6, 7, 8])
    assert a[1].tokens == b[1].tokens and a[1].key != b[1].key  # after another first block
    assert a[1].parent == a[0].key == block_key(ROOT, (1, 2, 3, 4))


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
    first = write(tmp_path, KEY, BLOCKS[:3])
    assert callable(damage)
    damage(first[0])
    second = write(tmp_path / "other", KEY, BLOCKS[3:])[0]
    second.rename(tmp_path / f"prefix-{KEY.digest}-0001.bin")
    with caplog.at_level(logging.WARNING):
        assert read(tmp_path, KEY) == BLOCKS[3:]  # the good file still counts
    [line] = skipped(caplog)
    assert why in line.fields["why"]  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "field", ["model_sha256", "llama_cpp", "block_size", "layout", "type_k", "flash_attn"]
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
    shallow = chain([5, 5, 5, 5]) + chain([6, 6, 6, 6])
    assert choose(shallow, size) == shallow[:1]  # of equal depth, the caller's order stands
    assert choose(shallow[::-1], size) == shallow[1:]


def host_blocks(tokens: list[int]) -> list[StoredBlock]:
    """``chain`` with KV of a ``LAYOUT`` block's size (a tail's fills the start of its row)."""
    return [
        dataclasses.replace(b, kv=bytes([b.depth + 1]) * BLOCK * LAYOUT.cell_bytes)
        for b in chain(tokens)
    ]


def test_loading_into_a_small_prefix_cache_keeps_the_first_written() -> None:
    deep = host_blocks(list(range(1, 21)))
    host = HostCache(LAYOUT, BLOCK, 2 * BLOCK * LAYOUT.cell_bytes)  # two rows
    assert load_into(host, deep) == 2
    hit = host.lookup(list(range(1, 21)))
    assert (hit.n_tokens, hit.disk_tokens) == (8, 8)
    assert [host.arena[row].tobytes() for row in hit.block_ids] == [b.kv for b in deep[:2]]


def test_blocks_and_tails_go_out_as_they_came_in() -> None:
    """What a cache holds, as written out: every block and tail under its own key, shallow
    ones first; read back into another cache it gives the same blocks again."""
    blocks = host_blocks([1, 2, 3, 4, 5, 6]) + host_blocks([1, 2, 3, 4, 9, 9, 9, 9, 9])
    blocks = [b for i, b in enumerate(blocks) if i != 2]  # [1, 2, 3, 4] once
    host = HostCache(LAYOUT, BLOCK, 10 * BLOCK * LAYOUT.cell_bytes)
    assert load_into(host, blocks) == 4
    out = stored_blocks(host)
    assert [b.depth for b in out] == sorted(b.depth for b in out)
    assert sorted(out, key=lambda b: b.key) == sorted(blocks, key=lambda b: b.key)
    again = HostCache(LAYOUT, BLOCK, 10 * BLOCK * LAYOUT.cell_bytes)
    assert load_into(again, out) == 4
    assert sorted(stored_blocks(again), key=lambda b: b.key) == sorted(out, key=lambda b: b.key)
    assert again.lookup([1, 2, 3, 4, 9, 9, 9, 9, 9, 0]).n_tokens == 9  # two blocks and a tail


def test_a_short_bound_writes_the_most_recently_used_of_equal_depth() -> None:
    blocks = host_blocks([5, 5, 5, 5]) + host_blocks([6, 6, 6, 6])
    for used in blocks:  # whichever row each has, the one used last is written
        host = HostCache(LAYOUT, BLOCK, 2 * BLOCK * LAYOUT.cell_bytes)
        assert load_into(host, blocks) == 2
        assert host.lookup([*used.tokens, 0]).n_tokens == BLOCK
        assert choose(stored_blocks(host), used.size) == [used]


def test_a_prefix_kept_on_disk_is_restored_by_the_next_engine(
    runtime: LlamaRuntime, tmp_path: Path
) -> None:
    """One engine writes its prefix cache at the end of a drain; the next reads it at start,
    and a prompt that starts the same way is written into its slot from there."""
    config = core_config(cache_dir=str(tmp_path))
    prompt = list(range(1000, 1100))
    before = Driver(EngineCore(config, runtime))
    before.submit(prompt, max_tokens=2)
    before.run()
    kept = KeptCache.open(config, runtime, before.core.kv)
    assert kept is not None and kept.save() == 7  # 6 blocks and a tail of 5
    after = Driver(EngineCore(config, runtime))
    kept = KeptCache.open(config, runtime, after.core.kv)
    assert kept is not None and kept.load() == 7
    rid = after.submit(prompt, max_tokens=2)
    after.run()
    timeline = after.final(rid).timeline
    assert timeline is not None
    assert timeline["restore"]["tier"] == TIER_DISK
    assert after.final(rid).cached_tokens == timeline["restore"]["tokens"] == len(prompt) - 1
    assert after.core.cache_stats.hit_tokens[TIER_DISK] == len(prompt) - 1
