from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import llama_cpp
import pytest

from tinyserve.config import Config, build_config
from tinyserve.engine.runtime.runtime import LlamaRuntime, RuntimeSpec
from tinyserve.model import resolve_model_path

# Small enough to be quick, large enough for several sequences at once: 4 slots of 512 cells.
CORE_SETTINGS: dict[str, Any] = {
    "ctx_per_slot": 512,
    "slots": 4,
    "chunk": 32,
    "max_batch_tokens": 64,
    "block_size": 16,
    "max_queue": 8,
    "threads": 1,  # the test machine's cores are shared: a second thread spins and waits
    # one token per step: whether a guess pays depends on the machine's timings, and tests
    # count steps (tests/engine/test_speculation.py turns it on, with a fixed bar)
    "speculate": "off",
}


def core_config(**overrides: Any) -> Config:
    return build_config({**CORE_SETTINGS, **overrides}, environ={})


@pytest.fixture(scope="session")
def tokenize() -> Callable[[str], list[int]]:
    """Text to token ids with the default model's vocabulary (as a frontend would do it)."""
    vocab = llama_cpp.Llama(str(resolve_model_path(None)), vocab_only=True, verbose=False)
    return lambda text: vocab.tokenize(text.encode(), add_bos=True, special=True)


@pytest.fixture(scope="session")
def runtime() -> Iterator[LlamaRuntime]:
    rt = LlamaRuntime(RuntimeSpec.from_config(core_config()))
    yield rt
    rt.close()


@pytest.fixture(scope="session")
def exact_runtime() -> Iterator[LlamaRuntime]:
    """The runtime with flash attention on. Its CPU kernel computes each of a stream's rows
    below a tile of 64 on its own, so a row's logits do not depend on how many rows of its
    sequence a step holds; with it off (the CPU's default) they move in the last bits with
    the batch (docs/api.md, "Reproducibility"). Tests that compare replies across batch
    shapes (with speculation and without) use it: they check the engine's rule, not
    llama.cpp's summing order."""
    rt = LlamaRuntime(RuntimeSpec.from_config(core_config(flash_attn="on")))
    yield rt
    rt.close()
