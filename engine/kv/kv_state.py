"""llama.cpp's saved sequence state, cut into blocks of positions and joined back.

The prefix cache keeps KV outside llama.cpp's cells, block by block, and a hit writes a whole
prefix back into a slot at once (``llama_state_seq_set_data`` replaces the sequence's cells,
so a restore cannot add blocks one at a time). This module is the one place that knows the
bytes ``llama_state_seq_get_data`` writes for a plain KV cache (read in the vendored
llama.cpp, ``src/llama-context.cpp`` ``state_seq_get_data`` and ``src/llama-kv-cache.cpp``
``state_write``/``state_write_meta``/``state_write_data``)::

    u32 magic, i32 seq_id, u32 n_stream, then for each stream: u32 cell_count, and when it
    is not 0: cell_count cell records (i32 pos, u32 n_seq_id, [a model-specific extension],
    i32 seq_id), u32 v_trans, u32 n_layer, one K record per layer (i32 type, u64 row bytes,
    one row per cell), then the V records: like K, or transposed (i32 type, u32 element
    bytes, u32 n_embd, then n_embd runs of one element per cell).

Cells come in cell order, not position order. A block of the cache is the bytes of its
``block_size`` cells in every record, one row of a ``HostCache`` arena: the cell records,
then each K and V record's rows (a tail, the partial block that ends a sequence, fills the
start of a row). Blocks from anywhere in the arena are joined into one state
of consecutive positions for the reading side, which takes the cells into any stream.

The layout (record headers, row sizes) is read off a real saved state at start-up
(``StateLayout.read``); a state this module cannot take apart (another cache type: sliding
windows, recurrent layers) raises ``StateFormatError`` and the engine runs without the
shared cache.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

Bytes = npt.NDArray[np.uint8]

_U32 = struct.Struct("<I")
_HEAD = struct.Struct("<IiI")  # magic, seq_id, n_stream
_MAGIC = 0xAF143CD8  # llama-context.cpp's io_magic for a sequence's state
_CELL_MIN = 12  # pos, n_seq_id, one seq_id; a model may add an extension between them
_CELL_MAX = 64


class StateFormatError(ValueError):
    """A saved state this module cannot cut into blocks; the message says why."""


@dataclass(frozen=True)
class Record:
    """One K or V record of a layer: its header as written, and its payload per cell:
    ``runs`` runs (1, or ``n_embd`` for a transposed V) of ``width`` bytes per cell."""

    header: bytes
    runs: int
    width: int

    @property
    def cell_bytes(self) -> int:
        return self.runs * self.width


@dataclass(frozen=True)
class StateLayout:
    """What a saved state of this model and context looks like, cell count aside."""

    n_stream: int
    cell_record: int  # bytes of one cell record (pos, n_seq_id, extension, seq_id)
    middle: bytes  # v_trans and n_layer, between the cell records and the K records
    records: tuple[Record, ...]

    @property
    def cell_bytes(self) -> int:
        """Bytes one cell takes in a block: its record plus its share of every K and V."""
        return self.cell_record + sum(r.cell_bytes for r in self.records)

    @classmethod
    def read(cls, state: bytes, n_layer: int) -> StateLayout:
        """The layout of ``state``, a sequence of at least one cell saved from this context;
        ``n_layer`` is the model's, for telling the cell records' size."""
        try:
            return cls._read(state, n_layer)
        except struct.error as exc:  # a count or header past the end of the state
            raise StateFormatError(f"the saved state ends early: {exc}") from None

    @classmethod
    def _read(cls, state: bytes, n_layer: int) -> StateLayout:
        n_stream, count, start = _the_stream(state)
        end = len(state) - _U32.size * _streams_after(state, n_stream)
        for cell_record in range(_CELL_MIN, _CELL_MAX + 1, 4):
            middle_at = start + count * cell_record
            if middle_at + 8 > end:
                break
            v_trans, layers = struct.unpack_from("<II", state, middle_at)
            if v_trans not in (0, 1) or layers != n_layer:
                continue
            try:  # (v_trans, n_layer) may be a coincidence inside longer cell records
                records = _records(state, middle_at + 8, end, count, n_layer, bool(v_trans))
            except StateFormatError:
                continue
            middle = state[middle_at : middle_at + 8]
            return cls(n_stream, cell_record, bytes(middle), records)
        raise StateFormatError("no cell record size fits a plain KV cache of this model")

    def positions(self, state: Bytes) -> tuple[int, npt.NDArray[np.int32]]:
        """The cell count of ``state`` (saved with this layout) and each cell's position."""
        _, count, start = _the_stream(state)
        stride = self.cell_record // 4
        records = np.frombuffer(state, np.int32, count * stride, start).reshape(count, stride)
        return count, records[:, 0]

    def cut(
        self, state: Bytes, first: int, n_cells: int, arena: Bytes, rows: list[int], block_size: int
    ) -> None:
        """Copy the cells at positions ``first .. first + n_cells - 1`` of ``state`` (a
        sequence holding positions 0..n-1) into ``arena``'s ``rows``, ``block_size`` a row, as
        ``join`` reads them; the last row may take fewer (the rest of it is left as it was)."""
        count, positions = self.positions(state)
        order = np.argsort(positions, kind="stable")
        if not np.array_equal(positions[order], np.arange(count)):
            raise StateFormatError("the saved cells are not positions 0..n-1 of one sequence")
        if first + n_cells > count or -(-n_cells // block_size) != len(rows):
            raise ValueError(f"cells {first}..{first + n_cells} of {count} into {len(rows)} rows")
        cells = order[first : first + n_cells]
        cells = np.concatenate([cells, np.repeat(cells[-1:], len(rows) * block_size - n_cells)])
        n_blocks, column = len(rows), 0
        for offset, runs, width in self._payloads(state, count):
            payload = np.frombuffer(state, np.uint8, runs * count * width, offset)
            block = payload.reshape(runs, count, width)[:, cells, :]
            block = block.reshape(runs, n_blocks, block_size * width).transpose(1, 0, 2)
            size = runs * block_size * width
            arena[rows, column : column + size] = block.reshape(n_blocks, size)
            column += size

    def state_bytes(self, n_cells: int) -> int:
        """The size of a saved state of ``n_cells`` cells."""
        headers = self.middle + b"".join(r.header for r in self.records)
        return _HEAD.size + _U32.size * self.n_stream + len(headers) + n_cells * self.cell_bytes

    def join(
        self, arena: Bytes, rows: list[int], block_size: int, n_cells: int, out: Bytes
    ) -> Bytes:
        """One saved state of the sequence whose positions 0..n_cells-1 the rows hold in
        ``arena`` (in position order, ``block_size`` cells a row, the last row perhaps fewer),
        for ``llama_state_seq_set_data``: written into the start of ``out`` (reused by the
        caller: fresh pages cost more than the copy), returned."""
        whole, tail = divmod(n_cells, block_size)
        assert len(rows) == whole + (1 if tail else 0), f"{len(rows)} rows for {n_cells} cells"
        out = out[: self.state_bytes(n_cells)]
        _HEAD.pack_into(out.data, 0, _MAGIC, 0, self.n_stream)
        _U32.pack_into(out.data, _HEAD.size, n_cells)
        at, column = _HEAD.size + _U32.size, 0
        for i, (runs, width) in enumerate(self._shapes()):
            if i:
                header = self.records[i - 1].header
                at = _put(out, at, self.middle + header if i == 1 else header)
            size, row = runs * block_size * width, block_size * width
            dest = out[at : at + runs * n_cells * width].reshape(runs, n_cells * width)
            if whole:  # each run: every cell, in position order
                blocks = arena[rows[:whole], column : column + size].reshape(whole, runs, row)
                dest[:, : whole * row].reshape(runs, whole, row)[...] = blocks.transpose(1, 0, 2)
            if tail:
                last = arena[rows[whole], column : column + size].reshape(runs, row)
                dest[:, whole * row :] = last[:, : tail * width]
            at += runs * n_cells * width
            column += size
        out[at:] = 0  # the other streams' counts: empty
        return out

    def _shapes(self) -> list[tuple[int, int]]:
        """(runs, width) of each payload in a block: the cell records, then each record."""
        return [(1, self.cell_record)] + [(r.runs, r.width) for r in self.records]

    def _payloads(self, state: Bytes, count: int) -> list[tuple[int, int, int]]:
        """(offset, runs, width) of each payload of ``state``, in ``_shapes`` order."""
        _, _, offset = _the_stream(state)
        found = [(offset, 1, self.cell_record)]
        offset += count * self.cell_record + len(self.middle)
        for record in self.records:
            offset += len(record.header)
            found.append((offset, record.runs, record.width))
            offset += count * record.cell_bytes
        return found


def _put(out: Bytes, at: int, data: bytes) -> int:
    out[at : at + len(data)] = np.frombuffer(data, np.uint8)
    return at + len(data)


def _the_stream(saved: bytes | Bytes) -> tuple[int, int, int]:
    """(n_stream, cell count, offset of its first cell record) of the one stream with cells."""
    state = memoryview(saved) if isinstance(saved, bytes) else saved.data
    if len(state) < _HEAD.size:
        raise StateFormatError(f"a state of {len(state)} bytes")
    magic, _, n_stream = _HEAD.unpack_from(state, 0)
    if magic != _MAGIC:
        raise StateFormatError(f"magic {magic:#x}, not a sequence state")
    offset = _HEAD.size
    for _ in range(n_stream):
        (count,) = _U32.unpack_from(state, offset)
        offset += _U32.size
        if count:
            return n_stream, count, offset
    raise StateFormatError("the state holds no cells")


def _streams_after(state: bytes, n_stream: int) -> int:
    """How many empty streams follow the one with cells (their counts end the state)."""
    offset = _HEAD.size
    for index in range(n_stream):
        (count,) = _U32.unpack_from(state, offset)
        if count:
            return n_stream - index - 1
        offset += _U32.size
    return 0


def _records(
    state: bytes, offset: int, end: int, count: int, n_layer: int, v_trans: bool
) -> tuple[Record, ...]:
    """The K records (``n_layer``), then V records up to ``end`` (a layer may have none)."""
    records: list[Record] = []
    while offset < end:
        transposed = v_trans and len(records) >= n_layer
        if offset + 12 > end:
            raise StateFormatError("a K or V record's header runs past the saved state")
        if transposed:
            _, width, runs = struct.unpack_from("<iII", state, offset)
            header_size = 12
        else:
            _, row = struct.unpack_from("<iQ", state, offset)
            runs, width, header_size = 1, row, 12
        records.append(Record(bytes(state[offset : offset + header_size]), runs, width))
        offset += header_size + runs * count * width
    if offset != end or len(records) < n_layer or len(records) > 2 * n_layer:
        raise StateFormatError("the K and V records do not add up to the saved state")
    return tuple(records)
