"""A generation request as the pipeline runs it, whichever surface it came from: the
``Generation`` a surface's handler translates its body into (``resolved``), and the checks
that need the served model (the grammar builds with its vocabulary, the token ids a request
names are in it). The bodies' own rules live in ``models``, its limits in ``admission``."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from tinyserve.frontend.models.errors import ApiError, invalid
from tinyserve.frontend.models.fields import Sampling
from tinyserve.frontend.prompt.chat_template import ChatPrompt
from tinyserve.frontend.request import notices
from tinyserve.frontend.request.admission import serving
from tinyserve.frontend.request.state import LINK, METRICS, TOKENIZER
from tinyserve.frontend.structured.constraints import Constraint
from tinyserve.protocol import SamplingParams


@dataclass(frozen=True)
class Generation:
    """A checked request with every default resolved (not yet tokenized); ``sampling`` goes
    to the engine as it is. ``prompt`` is text, or a conversation the chat template
    rendered (tokenized in parts)."""

    prompt: str | ChatPrompt
    max_tokens: int  # more than fits is clamped at admission (``request.pipeline``)
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
    # The client named ``max_tokens`` (a clamp is reported), rather than leaving it to the
    # surface's default.
    max_tokens_asked: bool = True


_SAMPLING = frozenset(field.name for field in dataclasses.fields(SamplingParams))
_GENERATION = frozenset(field.name for field in dataclasses.fields(Generation)) | _SAMPLING


def resolved(req: Sampling, **overrides: Any) -> Generation:
    """``req`` with every default resolved: each field ``Generation`` (or its sampling) has
    too, by name, then ``overrides``."""
    names = type(req).model_fields
    values = {name: getattr(req, name) for name in _GENERATION if name in names}
    values |= overrides
    if "logit_bias" in values:  # JSON keys are strings; the engine's are token ids
        values["logit_bias"] = {int(k): v for k, v in values["logit_bias"].items()}
    sampling = SamplingParams(**{name: values.pop(name) for name in _SAMPLING & set(values)})
    return Generation(sampling=sampling, **values)


def check_token_ids(token_ids: Iterable[int], n_vocab: int, field: str = "prompt") -> None:
    """Token ids a request gives (a prompt, ``logit_bias`` keys, ``/detokenize``'s tokens)
    must name tokens of the served model: a 400 naming ``field`` and the first that does not."""
    bad = next((t for t in token_ids if t >= n_vocab), None)
    if bad is not None:
        raise invalid(f"'{field}' token id {bad} is not in the vocabulary (size {n_vocab})", field)


async def constrained(
    request: web.Request, generation: Generation, constraint: Constraint
) -> Generation:
    """``generation`` with the constraint's grammar, every check passed (else a 400); both
    outcomes of a constraint are counted (``tinyserve_constrained_requests_total``), and what
    of its schemas the grammar does not enforce is reported (``notices``)."""
    source, counted = constraint.source, request.app[METRICS].constrained_requests_total
    try:
        if source is not None:
            grammar, unenforced = constraint.build()
            sampling = dataclasses.replace(generation.sampling, grammar=grammar)
            generation = dataclasses.replace(generation, sampling=sampling)
            if unenforced:  # one notice per field, naming the keywords (places: the log's)
                keywords = ", ".join(sorted({where.rsplit(": ", 1)[-1] for where in unenforced}))
                notices.note(request, f"{constraint.field} schema keywords ({keywords})")
        await _check(request, generation, constraint.field)
    except ApiError:
        if source is not None:
            counted.labels(source, "invalid").inc()
        raise
    if source is not None:
        counted.labels(source, "ok").inc()
    return generation


async def _check(request: web.Request, generation: Generation, field: str) -> None:
    sampling = generation.sampling
    if sampling.logit_bias:
        n_vocab = serving(request.app[LINK]).n_vocab
        check_token_ids(sampling.logit_bias, n_vocab, "logit_bias")
    if not sampling.grammar:
        return
    if sampling.ignore_eos or sampling.min_tokens:
        which = "ignore_eos" if sampling.ignore_eos else "min_tokens"
        message = f"'{which}' cannot be combined with '{field}': the output must end where it does"
        raise invalid(message, which)
    problem = await request.app[TOKENIZER].grammar_problem(sampling.grammar)
    if problem is not None:
        raise invalid(f"'{field}' does not compile: {problem}", field)
