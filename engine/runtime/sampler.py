"""One sequence's way of picking tokens: a llama.cpp sampler chain, and a grammar when the
request constrains its output.

The chain follows llama.cpp's own order (``common_sampler``): logit bias, penalties, top-k,
typical-p, top-p, min-p, temperature, then the seeded pick (or greedy at temperature 0).
Greedy with no stage before it (no bias, no penalties, no grammar) skips the chain: the pick is
the first highest logit, as llama.cpp's greedy stage picks it, found by numpy in the logits
buffer in ~5 us where ``llama_sampler_sample`` first copies the whole vocabulary into a
candidate array (~50 us alone, ~100-150 us right after a decode; bench/sampling_cost.py).

A grammar is applied before the chain, on a candidate array this module builds, instead of
being one more stage of the chain: llama.cpp's grammar sampler throws a C++ exception (which
would end the engine process) when it is asked to accept a token it did not allow, which is
what happens when no token is allowed at all. Here the allowed candidates are checked first
and a dead end is a ``RequestError`` for that request only. Dropping the disallowed
candidates also spares the later stages a full-vocabulary pass.

No lazy grammars (``llama_sampler_init_grammar_lazy_patterns``): once triggered, llama.cpp
feeds the grammar the text after the trigger inside its accept call, with no chance to check
it first, and a token that carries text the grammar rejects aborted the process when tried.

With the runtime, the only engine module that imports ``llama_cpp``.
"""

from __future__ import annotations

import ctypes
import hashlib
import math
import time
from dataclasses import dataclass
from typing import Any

import llama_cpp
import numpy as np

from tinyserve.errors import RequestError
from tinyserve.protocol import SamplingParams
from tinyserve.timeline_records import GrammarWire

PENALTY_LAST_N = 64  # tokens the repetition/presence/frequency penalties look back over
_CELL = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])
assert _CELL.itemsize == ctypes.sizeof(llama_cpp.llama_token_data)


@dataclass(frozen=True)
class Vocab:
    """What a sampler needs to know about the model's vocabulary."""

    handle: Any  # llama_vocab_p
    n_vocab: int
    eog_tokens: list[int]


def grammar_hash(grammar: str) -> str:
    """A short, stable name of a grammar, for timelines and logs."""
    return hashlib.sha256(grammar.encode("utf-8")).hexdigest()[:16]


class Sampler:
    """One llama.cpp sampler chain (and grammar), owned by one sequence.

    ``RequestError`` if it cannot be built from ``params`` (nothing is left allocated then)
    or, in ``sample``, if it picks a token outside the vocabulary or the grammar allows none.
    ``grammar`` is what a timeline shows of the grammar: its hash and build time.
    """

    def __init__(self, params: SamplingParams, vocab: Vocab) -> None:
        self._vocab = vocab
        # Tokens before which no end-of-generation token may be picked.
        self._eog_banned = math.inf if params.ignore_eos else params.min_tokens
        self._sampled = 0
        self._grammar: Any = None
        self._cells: np.ndarray | None = None
        self._argmax = False  # plain greedy: the chain is the greedy stage alone
        self.grammar: GrammarWire | None = None
        chain_params = llama_cpp.llama_sampler_chain_default_params()
        chain_params.no_perf = True
        self._chain = llama_cpp.llama_sampler_chain_init(chain_params)
        if not self._chain:
            raise RequestError("llama.cpp could not create a sampler chain")
        try:
            self._build(params)
            if params.grammar:
                self._build_grammar(params)
        except BaseException:
            self.free()  # nothing half-built stays allocated
            raise

    def _build(self, params: SamplingParams) -> None:
        n_vocab = self._vocab.n_vocab
        bias = {int(token): value for token, value in params.logit_bias.items()}
        if bias:
            entries = (llama_cpp.llama_logit_bias * len(bias))(
                *(llama_cpp.llama_logit_bias(token, value) for token, value in bias.items())
            )
            self._add(llama_cpp.llama_sampler_init_logit_bias(n_vocab, len(bias), entries))
        repeat, freq, present = (
            params.repetition_penalty,
            params.frequency_penalty,
            params.presence_penalty,
        )
        if repeat != 1.0 or freq or present:
            self._add(
                llama_cpp.llama_sampler_init_penalties(
                    n_vocab, PENALTY_LAST_N, repeat, freq, present
                )
            )
        if params.temperature <= 0.0:
            self._add(llama_cpp.llama_sampler_init_greedy())
            chain_len = llama_cpp.llama_sampler_chain_n(self._chain)
            self._argmax = chain_len == 1 and not params.grammar
            return
        if params.top_k > 0:
            self._add(llama_cpp.llama_sampler_init_top_k(params.top_k))
        if params.typical_p < 1.0:
            self._add(llama_cpp.llama_sampler_init_typical(params.typical_p, 1))
        if params.top_p < 1.0:
            self._add(llama_cpp.llama_sampler_init_top_p(params.top_p, 1))
        if params.min_p > 0.0:
            self._add(llama_cpp.llama_sampler_init_min_p(params.min_p, 1))
        self._add(llama_cpp.llama_sampler_init_temp(params.temperature))
        seed = llama_cpp.LLAMA_DEFAULT_SEED if params.seed is None else params.seed & 0xFFFFFFFF
        self._add(llama_cpp.llama_sampler_init_dist(seed))

    def _build_grammar(self, params: SamplingParams) -> None:
        started = time.perf_counter()
        text = params.grammar.encode("utf-8")
        self._grammar = llama_cpp.llama_sampler_init_grammar(self._vocab.handle, text, b"root")
        if not self._grammar:
            self._grammar = None
            raise RequestError("the grammar does not compile")
        self._cells = np.zeros(self._vocab.n_vocab, dtype=_CELL)
        self.grammar = {
            "hash": grammar_hash(params.grammar),
            "full_passes": 0,
            "build_ms": round((time.perf_counter() - started) * 1e3, 3),
        }

    def _add(self, sampler: int) -> None:
        if not sampler:
            raise RequestError("llama.cpp could not create a sampler stage")
        llama_cpp.llama_sampler_chain_add(self._chain, sampler)

    @property
    def greedy(self) -> bool:
        """Whether the next token is the argmax of the raw logits (plain greedy, no ban left):
        the runner then picks it for many rows in one pass and hands it to ``took``."""
        return self._argmax and self._sampled >= self._eog_banned

    def took(self, token: int) -> None:
        """``token`` was picked for this sequence outside ``sample`` (greedy)."""
        self._sampled += 1

    def sample(self, ctx: llama_cpp.llama_context_p, row: int) -> int:
        """Pick the next token from the logits of batch row ``row`` (also records it)."""
        if self._sampled < self._eog_banned:
            # the logits buffer is ours until the next decode. Banned here, before the
            # grammar sees them, a grammar that can only end is a dead end (an error).
            logits = self._logits(ctx, row)
            logits[self._vocab.eog_tokens] = -math.inf
        if self._argmax:
            # what llama_sampler_sample would return; greedy's accept records nothing.
            token = int(self._logits(ctx, row).argmax())
        elif self._grammar is None:
            token = int(llama_cpp.llama_sampler_sample(self._chain, ctx, row))
        else:
            token = self._sample_constrained(ctx, row)
        if not 0 <= token < self._vocab.n_vocab:
            raise RequestError(f"the sampler picked token {token}, outside the vocabulary")
        self._sampled += 1
        return token

    def _logits(self, ctx: llama_cpp.llama_context_p, row: int) -> np.ndarray:
        ptr = llama_cpp.llama_get_logits_ith(ctx, row)
        return np.ctypeslib.as_array(ptr, shape=(self._vocab.n_vocab,))

    def _sample_constrained(self, ctx: llama_cpp.llama_context_p, row: int) -> int:
        """As llama.cpp's own server: the chain picks from every candidate, and only when the
        grammar refuses that token does it pick again from the candidates the grammar allows.
        Asking the grammar about one token costs microseconds; about the whole vocabulary,
        ~10-30 ms here, per sequence and token (measured). Both verdicts are checked before
        the grammar is told the token."""
        logits = self._logits(ctx, row)
        token = self._pick(logits, None)
        if not self._allows(token):
            assert self.grammar is not None
            self.grammar["full_passes"] += 1
            permitted = self._permitted(logits)
            token = self._pick(logits, permitted)
            if not permitted[token]:
                raise RequestError(f"the sampler picked token {token}, which the grammar forbids")
        # Both record the token: the grammar advances, penalties remember it.
        llama_cpp.llama_sampler_accept(self._grammar, token)
        llama_cpp.llama_sampler_accept(self._chain, token)
        return token

    def _candidates(self, logits: np.ndarray, permitted: np.ndarray | None) -> Any:
        """A candidate array over ``self._cells``: every token, or the ``permitted`` ones."""
        cells = self._cells
        assert cells is not None
        ids = np.arange(len(cells), dtype=np.int32)
        if permitted is not None:
            ids = ids[permitted]
        n = len(ids)
        cells["id"][:n], cells["logit"][:n], cells["p"][:n] = ids, logits[ids], 0.0
        data = cells.ctypes.data_as(llama_cpp.llama_token_data_p)
        return llama_cpp.llama_token_data_array(data, n, -1, False)

    def _pick(self, logits: np.ndarray, permitted: np.ndarray | None) -> int:
        """The chain's choice among the candidates (nothing recorded yet)."""
        array = self._candidates(logits, permitted)
        llama_cpp.llama_sampler_apply(self._chain, ctypes.byref(array))
        if not 0 <= array.selected < array.size:
            raise RequestError("the sampler chain selected no candidate")
        return int(array.data[array.selected].id)  # a stage may have moved the array

    def _allows(self, token: int) -> bool:
        """The grammar's verdict on ``token`` alone."""
        cell = llama_cpp.llama_token_data(token, 0.0, 0.0)
        array = llama_cpp.llama_token_data_array(ctypes.pointer(cell), 1, -1, False)
        llama_cpp.llama_sampler_apply(self._grammar, ctypes.byref(array))
        return bool(math.isfinite(cell.logit))

    def _permitted(self, logits: np.ndarray) -> np.ndarray:
        """Which tokens the grammar allows next, by token id; a dead end is an error."""
        array = self._candidates(logits, None)
        llama_cpp.llama_sampler_apply(self._grammar, ctypes.byref(array))
        assert self._cells is not None
        permitted: np.ndarray = np.isfinite(self._cells["logit"])  # the grammar keeps the order
        if not permitted.any():
            raise RequestError("the grammar allows no token at this point of the output")
        return permitted

    def free(self) -> None:
        if self._chain is not None:
            llama_cpp.llama_sampler_free(self._chain)
            self._chain = None
        if self._grammar is not None:
            llama_cpp.llama_sampler_free(self._grammar)
            self._grammar = None
