"""A reply's token counts before a surface words them: each surface's usage model is made
``of`` them (OpenAI's ``Usage``, ``AnthropicUsage``, ``ResponsesUsage``, ``NativeUsage``), and
``RequestRecord.counts`` is the one place they are taken for a request."""

from __future__ import annotations

from typing import NamedTuple


class TokenCounts(NamedTuple):
    prompt: int  # the prompt's tokens (the engine's figure when it gave one)
    completion: int  # the tokens the reply took
    cached: int  # the prompt's tokens the prefix cache served

    @staticmethod
    def summed(choices: list[TokenCounts], prompt: int) -> TokenCounts:
        """The counts of a call's several choices: their tokens and cached tokens summed, and
        ``prompt`` (each prompt once: its choices shared its prefill)."""
        completion, cached = sum(c.completion for c in choices), sum(c.cached for c in choices)
        return TokenCounts(prompt, completion, cached)
