"""A model-free stand-in for ``LlamaRuntime`` that keeps llama.cpp's KV cells, a stream per
sequence id, for the prefix-cache state machine (``test_prefix_cache_stateful.py``).

Each stream maps positions to tokens, in the order its cells were written (as llama.cpp's
cell order, which is not position order once a sequence lost and regained cells); a copy
between streams is whole, as llama.cpp's is. Its "model" samples from a hash of the tokens a
sequence sees at positions ``0..pos``, so a request that was handed a wrong or missing cell
generates something else than the same request run alone would.

Saved states are written and read in llama.cpp's layout (``engine/kv/kv_state.py`` describes
it), with one layer whose K row holds a cell's position and token and whose V row its token:
the real ``StateLayout`` cuts and joins them, and a block put back at the wrong place shows.
"""

from __future__ import annotations

import ctypes
import struct

import llama_cpp
import numpy as np
import numpy.typing as npt

from tinyserve import protocol as p
from tinyserve_native.batch_builder import BatchBuilder

EOG = 0
MAGIC = 0xAF143CD8
K_ROW, V_ROW = 8, 4


def next_token(context: tuple[int, ...], sampling: p.SamplingParams) -> int:
    """The fake model: what a sequence that sees ``context`` samples next. Tokens 1..3 (few,
    so outputs often share prefixes) and, one time in ten, the end-of-generation token."""
    h = hash((sampling.seed, *context)) & 0xFFFFFFFF
    if h % 10 == 0 and not sampling.ignore_eos:
        return EOG
    return 1 + (h // 10) % 3


def reference_output(request: p.Submit, n: int) -> tuple[list[int], int]:
    """The first ``n`` tokens a request generates when run alone, and the token after them."""
    context = list(request.prompt_ids)
    for _ in range(n):
        context.append(next_token(tuple(context), request.sampling))
    return context[len(request.prompt_ids) :], next_token(tuple(context), request.sampling)


def write_state(seq: int, n_stream: int, cells: dict[int, int]) -> bytes:
    """``cells`` (position -> token, in cell order) of stream ``seq`` as llama.cpp saves them."""
    counts = [len(cells) if s == seq else 0 for s in range(n_stream)]
    out = [struct.pack("<IiI", MAGIC, seq, n_stream)]
    for stream, count in enumerate(counts):
        out.append(struct.pack("<I", count))
        if stream != seq or not count:
            continue
        out += [struct.pack("<iIi", pos, 1, seq) for pos in cells]
        out.append(struct.pack("<II", 0, 1))  # v_trans, one layer
        out.append(struct.pack("<iQ", 1, K_ROW))
        out += [struct.pack("<ii", pos, token) for pos, token in cells.items()]
        out.append(struct.pack("<iQ", 1, V_ROW))
        out += [struct.pack("<i", token) for token in cells.values()]
    return b"".join(out)


def read_state(data: bytes, n_stream: int) -> dict[int, int]:
    """The cells a saved state holds; ``ValueError`` for anything llama.cpp would refuse,
    and for a cell whose K row disagrees with its record (a block put back wrongly)."""
    magic, _, streams = struct.unpack_from("<IiI", data, 0)
    if magic != MAGIC or streams != n_stream:
        raise ValueError("not a state of this context")
    offset, cells = 12, {}
    for _ in range(n_stream):
        (count,) = struct.unpack_from("<I", data, offset)
        offset += 4
        if not count:
            continue
        positions = [struct.unpack_from("<iIi", data, offset + 12 * i)[0] for i in range(count)]
        offset += 12 * count
        if struct.unpack_from("<IIiQ", data, offset) != (0, 1, 1, K_ROW):
            raise ValueError("layout")
        offset += 20
        keys = [struct.unpack_from("<ii", data, offset + 8 * i) for i in range(count)]
        offset += 8 * count + 12
        values = [struct.unpack_from("<i", data, offset + 4 * i)[0] for i in range(count)]
        offset += 4 * count
        for pos, (k_pos, token), value in zip(positions, keys, values, strict=True):
            if pos != k_pos or token != value:
                raise ValueError(f"cell {pos}: K row ({k_pos}, {token}), V {value}")
            cells[pos] = token
    if offset != len(data):
        raise ValueError("trailing bytes")
    return cells


class FakeSampler:
    grammar = None  # what a timeline shows of a grammar: these requests have none
    greedy = False  # the fake model picks by its hash, through ``sample``

    def __init__(self, runtime: FakeRuntime, params: p.SamplingParams) -> None:
        self.runtime = runtime
        self.params = params

    def sample(self, _ctx: object, row: int) -> int:
        return next_token(self.runtime.contexts[row], self.params)  # KeyError: no logits

    def free(self) -> None:
        pass


class FakeRuntime:
    """What the engine core uses of ``LlamaRuntime``, without a model. The batch is a real
    ``llama_batch`` written by the real ``BatchBuilder``; ``decode`` checks it as llama.cpp
    does (a sequence's rows continue its cells; room in its stream)."""

    ctx = None
    model = None  # what an embedding context would run on: these tests embed nothing
    n_layer = 1
    n_vocab = 8

    def __init__(self, n_ctx_seq: int, n_seq: int, n_batch: int) -> None:
        self.n_ctx_seq = n_ctx_seq
        self.n_seq = n_seq
        self.streams: list[dict[int, int]] = [{} for _ in range(n_seq)]
        self._batch = llama_cpp.llama_batch_init(n_batch, 0, 1)
        self.batch = BatchBuilder(ctypes.addressof(self._batch), n_batch)
        self.contexts: dict[int, tuple[int, ...]] = {}  # logits row -> tokens its sequence sees
        self.errors: list[str] = []

    def close(self) -> None:
        llama_cpp.llama_batch_free(self._batch)

    def clear(self) -> None:
        self.streams = [{} for _ in range(self.n_seq)]

    def share(self, src: int, dst: int, end: int) -> None:
        assert src != dst
        self.streams[dst] = dict(self.streams[src])
        self.forget(dst, end)

    def forget(self, seq_id: int, start: int = -1, end: int = -1) -> None:
        assert 0 <= seq_id < self.n_seq
        low, high = max(start, 0), end if end >= 0 else 1 << 62
        stream = self.streams[seq_id]
        for pos in [pos for pos in stream if low <= pos < high]:
            del stream[pos]

    def save_seq(self, seq_id: int) -> npt.NDArray[np.uint8]:
        data = write_state(seq_id, self.n_seq, self.streams[seq_id])
        return np.frombuffer(data, np.uint8).copy()

    def load_seq(self, seq_id: int, state: npt.NDArray[np.uint8]) -> bool:
        """llama.cpp's ``set_data``: the sequence's cells dropped, then the saved ones put in
        its stream; refused when they do not fit or do not parse."""
        self.streams[seq_id] = {}
        try:
            cells = read_state(state.tobytes(), self.n_seq)
        except ValueError as exc:
            self.errors.append(f"load_seq({seq_id}): {exc}")
            return False
        if len(cells) > self.n_ctx_seq:
            return False
        self.streams[seq_id] = cells
        return True

    def decode(self) -> int:
        rows = self._rows()
        error = self._invalid(rows)
        if error:
            self.errors.append(error)
            return -1
        for token, pos, seq, _ in rows:
            self.streams[seq][pos] = token
        self.contexts = {
            i: self._context(seq, pos) for i, (_, pos, seq, out) in enumerate(rows) if out
        }
        return 0

    def _rows(self) -> list[tuple[int, int, int, bool]]:
        b = self._batch
        return [
            (b.token[i], b.pos[i], b.seq_id[i][0], bool(b.logits[i])) for i in range(b.n_tokens)
        ]

    def _invalid(self, rows: list[tuple[int, int, int, bool]]) -> str:
        """llama.cpp's batch check: a sequence's rows continue its cells position by position
        (stricter: its cells are 0..n-1, as nothing before may be missing), within its
        stream's cells."""
        by_seq: dict[int, list[int]] = {}
        for _, pos, seq, _ in rows:
            by_seq.setdefault(seq, []).append(pos)
        for seq, positions in by_seq.items():
            if not 0 <= seq < self.n_seq:
                return f"seq {seq} out of range"
            held = sorted(self.streams[seq])
            if held != list(range(len(held))):
                return f"seq {seq} holds cells {held}"
            if positions != list(range(len(held), len(held) + len(positions))):
                return f"seq {seq}: batch positions {positions}, its cells end at {len(held)}"
            if len(held) + len(positions) > self.n_ctx_seq:
                return f"seq {seq}: no room for {len(positions)} more cells"
        return ""

    def _context(self, seq: int, pos: int) -> tuple[int, ...]:
        """What a row at ``pos`` attends to: its sequence's cells up to it (a guessed row's
        later cells are masked, as llama.cpp's causal mask does)."""
        seen = self.streams[seq]
        assert all(i in seen for i in range(pos + 1)), f"seq {seq} at {pos} sees {sorted(seen)}"
        return tuple(seen[i] for i in range(pos + 1))

    def argmax(self, rows: list[int]) -> list[int]:
        """The fake model's greedy pick for each of ``rows``."""
        return [next_token(self.contexts[row], p.SamplingParams()) for row in rows]

    def new_sampler(self, params: p.SamplingParams) -> FakeSampler:
        return FakeSampler(self, params)

    def is_eog(self, token: int) -> bool:
        return token == EOG

    def piece(self, token: int) -> bytes:
        return b"<%d>" % token

    def logprobs(self, _row: int, _token: int, _top_n: int) -> list[object]:
        return [0.0, []]
