"""The engine's logprobs read as tokens, for any surface's format.

The engine reports, per generated token, ``[logprob, [[token id, logprob], ...best first]]``
under the model's raw distribution (before temperature, top-p or penalties). Token texts come
from the frontend's tokenizer, special tokens spelled out, as bytes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from tinyserve.frontend.prompt.tokenizer import Tokenizer

# JSON has no -Infinity; a token the model rules out entirely reports this instead.
LOGPROB_FLOOR = -9999.0


@dataclass(frozen=True)
class TokenLogprob:
    """One generated token: its bytes, its logprob, and the best alternatives."""

    token: bytes
    logprob: float
    top: list[tuple[bytes, float]]

    @property
    def text(self) -> str:
        return self.token.decode("utf-8", "replace")


async def token_logprobs(
    tokenizer: Tokenizer, token_ids: list[int], entries: list[list[Any]]
) -> list[TokenLogprob]:
    """Pair each token with its engine entry and look up every token's text in one call."""
    wanted = sorted({*token_ids, *(int(alt[0]) for entry in entries for alt in entry[1])})
    pieces = dict(zip(wanted, await tokenizer.token_pieces(wanted), strict=True))
    # Not strict: a short entry list (an engine that sent none) yields fewer logprobs, not a
    # failed reply.
    return [
        TokenLogprob(
            pieces[token],
            finite(entry[0]),
            [(pieces[int(alt_id)], finite(alt_lp)) for alt_id, alt_lp in entry[1]],
        )
        for token, entry in zip(token_ids, entries, strict=False)
    ]


def finite(logprob: float) -> float:
    """A logprob JSON can hold (``LOGPROB_FLOOR`` for minus infinity)."""
    return float(logprob) if math.isfinite(logprob) else LOGPROB_FLOOR
