"""Per-token logprobs in OpenAI's two formats, built from the engine's raw entries.

The engine reports, per generated token, ``[logprob, [[token id, logprob], ...best first]]``
under the model's raw distribution (before temperature, top-p or penalties). Token texts come
from the frontend's tokenizer, special tokens spelled out; a token that is part of a UTF-8
character shows U+FFFD in ``token`` while ``bytes`` (chat) keeps its exact bytes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import Any

from tinyserve.frontend.openai.openai_replies import (
    ChatLogprobs,
    ChatTokenLogprob,
    CompletionLogprobs,
    TopLogprob,
)
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


def completion_logprobs(tokens: list[TokenLogprob], text_offset: int) -> CompletionLogprobs:
    """The completions format; ``text_offset`` is where the first token's text starts."""
    texts = [t.text for t in tokens]
    offsets = list(accumulate((len(s) for s in texts[:-1]), initial=text_offset))
    return CompletionLogprobs(
        tokens=texts,
        token_logprobs=[t.logprob for t in tokens],
        # OpenAI lists the chosen token among the alternatives: up to logprobs + 1 entries.
        top_logprobs=[_top_map(t) for t in tokens],
        text_offset=offsets if tokens else [],
    )


def echo_logprobs(
    first_token: bytes, prompt: Sequence[TokenLogprob], generated: list[TokenLogprob]
) -> CompletionLogprobs:
    """The completions format with ``echo``: the prompt's tokens (its first, ``first_token``,
    has no logprob), then the generated ones; offsets run through both from 0."""
    first = TokenLogprob(first_token, 0.0, [])
    body = completion_logprobs([first, *prompt, *generated], 0)
    body.token_logprobs[0] = None
    body.top_logprobs[0] = None
    return body


def chat_logprobs(tokens: list[TokenLogprob]) -> ChatLogprobs:
    """The chat completions format."""
    return ChatLogprobs(
        content=[
            ChatTokenLogprob(
                token=t.text,
                logprob=t.logprob,
                bytes=list(t.token),
                top_logprobs=[_chat_token(alt, lp) for alt, lp in t.top],
            )
            for t in tokens
        ]
    )


def _top_map(token: TokenLogprob) -> dict[str, float]:
    top = {alt.decode("utf-8", "replace"): lp for alt, lp in token.top}
    top.setdefault(token.text, token.logprob)
    return top


def _chat_token(token: bytes, logprob: float) -> TopLogprob:
    return TopLogprob(token=token.decode("utf-8", "replace"), logprob=logprob, bytes=list(token))


def finite(logprob: float) -> float:
    """A logprob JSON can hold (``LOGPROB_FLOOR`` for minus infinity)."""
    return float(logprob) if math.isfinite(logprob) else LOGPROB_FLOOR
