"""Prompt tokenization with the model's own vocabulary, off the event loop.

The only frontend module that imports ``llama_cpp``. The model is loaded ``vocab_only`` (no
weights, a few MB) and every call runs in one dedicated thread: llama.cpp is not asked to be
thread-safe, and a long prompt must not stall other requests' streams on the loop.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import llama_cpp

from tinyserve.config import Config
from tinyserve.logs import fields
from tinyserve.model import resolve_model_path

log = logging.getLogger(__name__)


class Tokenizer:
    """Tokenizes prompts in a single worker thread; create with ``await Tokenizer.load(...)``."""

    def __init__(self, llama: llama_cpp.Llama, executor: ThreadPoolExecutor) -> None:
        self._llama = llama
        self._executor = executor

    @classmethod
    async def load(cls, config: Config) -> Tokenizer:
        """Load the configured model's vocabulary in the worker thread."""
        path = resolve_model_path(config.model)
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokenizer")
        loop = asyncio.get_running_loop()
        try:
            llama = await loop.run_in_executor(executor, _load_vocab, path)
        except BaseException:
            executor.shutdown(wait=False)
            raise
        log.info("tokenizer loaded", extra=fields(model=str(path), n_vocab=llama.n_vocab()))
        return cls(llama, executor)

    async def tokenize(self, text: str) -> list[int]:
        """Token ids of ``text`` as the engine will see them: BOS added if the model's metadata
        asks for it, special tokens in the text parsed as such (chat templates rely on it)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._tokenize, text)

    def close(self) -> None:
        """Stop the worker thread (after any call in flight) and free the vocabulary."""
        self._executor.shutdown(wait=True, cancel_futures=True)
        self._llama.close()

    def _tokenize(self, text: str) -> list[int]:
        return list(self._llama.tokenize(text.encode("utf-8"), add_bos=True, special=True))


def _load_vocab(path: Path) -> llama_cpp.Llama:
    return llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
