"""Serve-side sampling defaults: what an OpenAI request that leaves out ``temperature``,
``top_k``, ``top_p`` or ``min_p`` gets. Each comes from its ``--default-*`` flag when given,
else from the model's GGUF metadata (``general.sampling.*``) when it has it, else from
llama-server's defaults, which keep a small model on track (issue 15: plain temperature 1.0
without truncation made SmolLM2 answer "Hello! Auces retrofits delcat").
``/generate`` keeps its own default: greedy."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from tinyserve.config import Config
from tinyserve.frontend.models.fields import Sampling

# Field -> (its GGUF key, the built-in default).
SOURCES: dict[str, tuple[str, float]] = {
    "temperature": ("general.sampling.temp", 0.8),
    "top_k": ("general.sampling.top_k", 40),
    "top_p": ("general.sampling.top_p", 0.95),
    "min_p": ("general.sampling.min_p", 0.05),
}


Source = Literal["flag", "gguf", "built-in"]


@dataclass(frozen=True)
class SamplingDefaults:
    """Read once, when the model's vocabulary loads."""

    values: dict[str, float | int]
    sources: dict[str, Source]  # where each value came from


def sampling_defaults(config: Config, metadata: Mapping[str, str]) -> SamplingDefaults:
    """The defaults this frontend serves, and where each came from."""
    values: dict[str, float | int] = {}
    sources: dict[str, Source] = {}
    for name, (key, builtin) in SOURCES.items():
        kind = int if name == "top_k" else float
        flag = getattr(config, f"default_{name}")
        if flag is not None:
            values[name], sources[name] = kind(flag), "flag"
        elif _number(metadata.get(key)) is not None:
            values[name], sources[name] = kind(_number(metadata.get(key)) or 0), "gguf"
        else:
            values[name], sources[name] = kind(builtin), "built-in"
    return SamplingDefaults(values, sources)


def _number(text: str | None) -> float | None:
    try:
        return None if text is None else float(text)
    except ValueError:
        return None


def left_out(req: Sampling, defaults: SamplingDefaults) -> dict[str, Any]:
    """The default fields ``req`` left out (or sent as null), with their values."""
    return {name: v for name, v in defaults.values.items() if name not in req.model_fields_set}
