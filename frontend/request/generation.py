"""A generation request as the pipeline runs it, whichever surface it came from, and the
checks that need its prompt tokenized (the bodies' own rules live in ``models``)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from tinyserve.frontend.http.api_errors import invalid, too_long
from tinyserve.protocol import SamplingParams


@dataclass(frozen=True)
class Generation:
    """A checked request with every default resolved (not yet tokenized); ``sampling`` goes
    to the engine as it is."""

    prompt: str
    max_tokens: int
    sampling: SamplingParams
    stream: bool = False
    priority: int = 0
    tenant: str = "default"
    timeline: bool = False
    prompt_logprobs: int = -1  # alternatives per prompt token (-1: no prompt logprobs)
    fork_of: str = ""  # another choice of the same prompt, whose prefill this one copies
    deadline_ms: int | None = None


def check_prompt_fits(prompt_tokens: int, max_tokens: int, n_ctx: int) -> None:
    """After tokenizing: an empty prompt, or one that cannot fit ``n_ctx``, is a 400."""
    if prompt_tokens == 0:
        raise invalid("'prompt' tokenizes to 0 tokens", "prompt")
    if prompt_tokens + max_tokens > n_ctx:
        raise too_long(
            f"prompt_tokens ({prompt_tokens}) + max_tokens ({max_tokens}) exceeds "
            f"the context length ({n_ctx})"
        )


def check_token_ids(token_ids: Iterable[int], n_vocab: int, field: str = "prompt") -> None:
    """Token ids a request gives (a prompt, ``logit_bias`` keys, ``/detokenize``'s tokens)
    must name tokens of the served model: a 400 naming ``field`` and the first that does not."""
    bad = next((t for t in token_ids if t >= n_vocab), None)
    if bad is not None:
        raise invalid(f"'{field}' token id {bad} is not in the vocabulary (size {n_vocab})", field)
