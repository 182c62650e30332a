"""A generation request as the pipeline runs it, whichever surface it came from, and the check
of token ids it names (the bodies' own rules live in ``models``, its limits in ``admission``)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from tinyserve.frontend.http.api_errors import invalid
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
    return_progress: bool = False  # a stream reports the prompt's prefill as it goes
    # The body field the prompt came from: the one a 400 about the prompt's length names
    # (OpenAI's ``param``).
    prompt_field: str = "prompt"


def check_token_ids(token_ids: Iterable[int], n_vocab: int, field: str = "prompt") -> None:
    """Token ids a request gives (a prompt, ``logit_bias`` keys, ``/detokenize``'s tokens)
    must name tokens of the served model: a 400 naming ``field`` and the first that does not."""
    bad = next((t for t in token_ids if t >= n_vocab), None)
    if bad is not None:
        raise invalid(f"'{field}' token id {bad} is not in the vocabulary (size {n_vocab})", field)
