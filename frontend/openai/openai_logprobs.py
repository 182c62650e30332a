"""Per-token logprobs in OpenAI's two formats, built from the engine's entries read as tokens
(``chat.logprobs``): a token that is part of a UTF-8 character shows U+FFFD in ``token``
while ``bytes`` (chat) keeps its exact bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate

from tinyserve.frontend.chat.logprobs import TokenLogprob
from tinyserve.frontend.openai.openai_replies import (
    ChatLogprobs,
    ChatTokenLogprob,
    CompletionLogprobs,
    TopLogprob,
)


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
