"""Serve-side sampling defaults: flag, else GGUF metadata, else built-in; only for the fields
a request leaves out."""

from __future__ import annotations

from tinyserve.config import build_config
from tinyserve.frontend.chat.chat_generation import chat_generation_of
from tinyserve.frontend.models.chat import ChatCompletionRequest
from tinyserve.frontend.request.sampling_defaults import sampling_defaults

CONFIG = build_config({"default_max_tokens": 32}, environ={})


def test_flag_beats_gguf_beats_built_in() -> None:
    config = build_config({"default_temperature": 0.3}, environ={})
    metadata = {"general.sampling.temp": "0.6", "general.sampling.top_k": "20", "x": "1"}
    defaults = sampling_defaults(config, metadata)
    assert defaults.values == {"temperature": 0.3, "top_k": 20, "top_p": 0.95, "min_p": 0.05}
    assert defaults.sources == {
        "temperature": "flag", "top_k": "gguf", "top_p": "built-in", "min_p": "built-in"
    }  # fmt: skip
    assert sampling_defaults(CONFIG, {"general.sampling.temp": "hot"}).sources["temperature"] == (
        "built-in"
    )


def test_only_fields_left_out_or_null_take_defaults() -> None:
    defaults = sampling_defaults(CONFIG, {})
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    req = ChatCompletionRequest.model_validate({**body, "temperature": 0, "top_p": None})
    sampling = chat_generation_of(req.turn(), CONFIG, defaults).sampling
    assert (sampling.temperature, sampling.top_p, sampling.top_k, sampling.min_p) == (
        0.0, 0.95, 40, 0.05
    )  # fmt: skip
