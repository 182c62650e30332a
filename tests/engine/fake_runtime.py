"""A model-free stand-in for ``LlamaRuntime`` that keeps llama.cpp's unified KV cells, for the
prefix-cache state machine (``test_prefix_cache_stateful.py``).

Each cell has a position, a token and the set of sequence ids that see it (``seq_cp`` and
``seq_rm`` as llama.cpp has them). Its "model" samples from a hash of the tokens a sequence
sees at positions ``0..pos``, so a request that was handed a wrong or missing cell generates
something else than the same request run alone would.
"""

from __future__ import annotations

import ctypes
import json
import sys
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field

import llama_cpp

from tinyserve import protocol as p
from tinyserve_native.batch_builder import BatchBuilder

EOG = 0


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


@dataclass
class Cell:
    pos: int
    token: int
    seqs: set[int] = field(default_factory=set)


class UnifiedKV:
    """llama.cpp's unified KV cache as its cells: ``seq_cp`` adds a sequence id to cells,
    ``seq_rm`` removes one, a cell no sequence sees is free; negative bounds are open."""

    def __init__(self) -> None:
        self.cells: list[Cell] = []

    def seq_cp(self, src: int, dst: int, p0: int, p1: int) -> None:
        for cell in self._cells_of(src, p0, p1):
            cell.seqs.add(dst)

    def seq_rm(self, seq: int, p0: int, p1: int) -> None:
        for cell in self._cells_of(seq, p0, p1):
            cell.seqs.discard(seq)
        self.cells = [c for c in self.cells if c.seqs]

    def _cells_of(self, seq: int, p0: int, p1: int) -> Iterator[Cell]:
        low, high = max(p0, 0), sys.maxsize if p1 < 0 else p1
        return (c for c in self.cells if seq in c.seqs and low <= c.pos < high)

    def view(self, seq: int) -> dict[int, list[int]]:
        """Position -> tokens of the cells ``seq`` sees there (one, unless something is wrong)."""
        seen: dict[int, list[int]] = defaultdict(list)
        for cell in self.cells:
            if seq in cell.seqs:
                seen[cell.pos].append(cell.token)
        return dict(seen)


def as_view(tokens: list[int], start: int = 0) -> dict[int, list[int]]:
    return {start + i: [t] for i, t in enumerate(tokens)}


class FakeSampler:
    grammar = None  # what a timeline shows of a grammar: these requests have none

    def __init__(self, runtime: FakeRuntime, params: p.SamplingParams) -> None:
        self.runtime = runtime
        self.params = params

    def sample(self, _ctx: object, row: int) -> int:
        return next_token(self.runtime.contexts[row], self.params)  # KeyError: no logits

    def free(self) -> None:
        pass


class FakeRuntime:
    """What ``EngineCore`` and ``PrefixCache`` use of ``LlamaRuntime``, without a model. The
    batch is a real ``llama_batch`` written by the real ``BatchBuilder``; ``decode`` checks it
    as llama.cpp does (a sequence's rows continue its cells; room for the new cells)."""

    ctx = None

    def __init__(self, n_ctx: int, n_seq_max: int, n_batch: int) -> None:
        self.n_ctx = self.n_ctx_seq = n_ctx  # unified: one sequence may use every cell
        self.n_seq_max = n_seq_max
        self.kv = UnifiedKV()
        self._batch = llama_cpp.llama_batch_init(n_batch, 0, 1)
        self.batch = BatchBuilder(ctypes.addressof(self._batch), n_batch)
        self.contexts: dict[int, tuple[int, ...]] = {}  # logits row -> tokens its sequence sees
        self.errors: list[str] = []

    def close(self) -> None:
        llama_cpp.llama_batch_free(self._batch)

    def clear(self) -> None:
        self.kv.cells.clear()

    def share(self, src: int, dst: int, start: int, end: int) -> None:
        assert 0 <= src < self.n_seq_max and 0 <= dst < self.n_seq_max and src != dst
        self.kv.seq_cp(src, dst, start, end)

    def forget(self, seq_id: int, start: int = -1, end: int = -1) -> None:
        assert 0 <= seq_id < self.n_seq_max
        self.kv.seq_rm(seq_id, start, end)

    def save_seq(self, seq_id: int) -> bytes:
        """The cells ``seq_id`` sees, as llama.cpp's state data would hold them."""
        cells = [(c.pos, c.token) for c in self.kv.cells if seq_id in c.seqs]
        return json.dumps(cells).encode()

    def load_seq(self, seq_id: int, data: bytes) -> bool:
        """llama.cpp's ``set_data``: the sequence's cells dropped, then the saved ones put in
        free cells for it alone; refused when there are not enough free cells."""
        cells = json.loads(data)
        self.kv.seq_rm(seq_id, -1, -1)
        if len(self.kv.cells) + len(cells) > self.n_ctx:
            return False
        self.kv.cells += [Cell(pos, token, {seq_id}) for pos, token in cells]
        return True

    def decode(self) -> int:
        rows = self._rows()
        error = self._invalid(rows) or self._no_room(rows)
        if error:
            self.errors.append(error)
            return -1
        for token, pos, seq, _ in rows:
            self.kv.cells.append(Cell(pos, token, {seq}))
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
        (stricter: one without cells starts at 0, as nothing before may be missing)."""
        by_seq: dict[int, list[int]] = defaultdict(list)
        for _, pos, seq, _ in rows:
            by_seq[seq].append(pos)
        for seq, positions in by_seq.items():
            held = self.kv.view(seq)
            start = max(held) + 1 if held else 0
            if not 0 <= seq < self.n_seq_max or positions != list(
                range(start, start + len(positions))
            ):
                return f"seq {seq}: batch positions {positions}, its cells end at {start}"
        return ""

    def _no_room(self, rows: list[tuple[int, int, int, bool]]) -> str:
        if len(self.kv.cells) + len(rows) > self.n_ctx:
            return f"no room: {len(self.kv.cells)} cells used, {len(rows)} more of {self.n_ctx}"
        return ""

    def _context(self, seq: int, pos: int) -> tuple[int, ...]:
        seen = self.kv.view(seq)
        assert sorted(seen) == list(range(pos + 1)) and all(len(t) == 1 for t in seen.values()), (
            f"seq {seq} computing position {pos} sees cells {seen}"
        )
        return tuple(seen[i][0] for i in range(pos + 1))

    def new_sampler(self, params: p.SamplingParams) -> FakeSampler:
        return FakeSampler(self, params)

    def is_eog(self, token: int) -> bool:
        return token == EOG

    def piece(self, token: int) -> bytes:
        return b"<%d>" % token

    def logprobs(self, _row: int, _token: int, _top_n: int) -> list[object]:
        return [0.0, []]
