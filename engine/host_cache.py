"""The prefix cache's host-memory tier: the KV of blocks evicted from llama.cpp's cells.

When the prefix cache evicts a block, its cells' KV (``llama_state_seq_get_data`` of a scratch
sequence that sees only that block) is kept here instead of being dropped, up to a byte bound,
least recently used first out. A later lookup that runs past what the cells hold continues
here, block by block, and the blocks it finds are written back into cells (``set_data``):
copying 16 tokens' KV costs far less than computing it (``bench/host_cache.py``).

Blocks are keyed by a hash chain over their tokens (``block_key``): a block's key names its
whole prefix from position 0, which is what its KV depends on, so a lookup follows the chain
from the last block the cells hold and a block is only ever found below the prefix it was
computed after. Host blocks hold no kv_blocks ids: the accounting counts cells only.
"""

from __future__ import annotations

import hashlib
import struct
from collections import OrderedDict
from collections.abc import Iterator
from collections.abc import Sequence as Tokens
from dataclasses import dataclass

ROOT = b""  # the key "before" a prefix's first block
KEY_BYTES = 16
_ENTRY_OVERHEAD = 200  # bytes a HostBlock costs beside its KV and tokens (objects, dict slot)


def block_key(parent: bytes, tokens: Tokens[int]) -> bytes:
    """The key of the block of ``tokens`` that follows the block keyed ``parent``."""
    packed = struct.pack(f"<{len(tokens)}i", *tokens)
    return hashlib.blake2b(parent + packed, digest_size=KEY_BYTES).digest()


def chain_keys(tokens: Tokens[int], block_size: int, parent: bytes = ROOT) -> list[bytes]:
    """The keys of each full block of ``tokens``, the first following ``parent``."""
    keys = []
    for start in range(0, len(tokens) - block_size + 1, block_size):
        parent = block_key(parent, tokens[start : start + block_size])
        keys.append(parent)
    return keys


@dataclass(frozen=True)
class HostBlock:
    """One block's KV, as llama.cpp wrote it for a sequence that held only its cells."""

    parent: bytes  # key of the block before it (ROOT for a prefix's first block)
    tokens: tuple[int, ...]
    kv: bytes
    depth: int  # blocks before it: its cells are at depth * block_size onwards

    @property
    def key(self) -> bytes:
        return block_key(self.parent, self.tokens)

    @property
    def size(self) -> int:
        """Bytes it is charged against the bound."""
        return len(self.kv) + 8 * len(self.tokens) + _ENTRY_OVERHEAD


class HostCache:
    """Blocks of ``block_size`` tokens by key, at most ``capacity`` bytes
    (``HostBlock.size``), least recently used out first."""

    def __init__(self, capacity: int, block_size: int) -> None:
        self.capacity = capacity
        self.block_size = block_size
        self.bytes = 0
        self.dropped = 0  # blocks pushed out by the bound, for metrics
        self._blocks: OrderedDict[bytes, HostBlock] = OrderedDict()

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, key: bytes) -> bool:
        return key in self._blocks

    def touch(self, key: bytes) -> bool:
        """Mark a block just used; False if it is not here."""
        if key not in self._blocks:
            return False
        self._blocks.move_to_end(key)
        return True

    def put(self, block: HostBlock) -> bool:
        """Keep ``block`` (most recently used), dropping the least recently used blocks while
        over the bound; False if it alone is larger than the bound (then nothing changes)."""
        assert len(block.tokens) == self.block_size, f"a block of {len(block.tokens)} tokens"
        key = block.key
        if self.touch(key):
            return True
        if block.size > self.capacity:
            return False
        self._blocks[key] = block
        self.bytes += block.size
        while self.bytes > self.capacity:
            _, old = self._blocks.popitem(last=False)
            self.bytes -= old.size
            self.dropped += 1
        return True

    def discard(self, key: bytes) -> None:
        """Forget a block (one whose KV llama.cpp refused)."""
        block = self._blocks.pop(key, None)
        if block is not None:
            self.bytes -= block.size

    def run(self, tokens: Tokens[int], first: int, parent: bytes, limit: int) -> list[HostBlock]:
        """The blocks here for ``tokens``' full blocks from block index ``first`` on, whose
        previous block is keyed ``parent``, up to ``limit`` blocks and the first one missing;
        each found is marked used."""
        found: list[HostBlock] = []
        size = self.block_size
        for i in range(first, first + limit):
            piece = tokens[i * size : (i + 1) * size]
            if len(piece) < size:
                break
            key = block_key(parent, piece)
            block = self._blocks.get(key)
            if block is None:
                break
            self._blocks.move_to_end(key)
            found.append(block)
            parent = key
        return found

    def blocks(self) -> Iterator[HostBlock]:
        """Every block, least recently used first."""
        return iter(list(self._blocks.values()))
