"""Prompt tokenization with the model's own vocabulary, off the event loop.

With ``llama_log``, the only frontend modules that import ``llama_cpp``. The model is loaded
``vocab_only`` (no weights, a few MB) and every call runs in one dedicated thread: llama.cpp
is not asked to be thread-safe, and a long prompt must not stall other requests' streams on
the loop. The same load yields what chat templates need: the GGUF's template and the BOS/EOS
token texts.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import llama_cpp

from tinyserve.config import Config
from tinyserve.frontend.models.errors import invalid
from tinyserve.frontend.prompt import llama_log
from tinyserve.frontend.prompt.chat_template import ChatPrompt
from tinyserve.logs import fields
from tinyserve.model import resolve_model_path

log = logging.getLogger(__name__)

CHAT_TEMPLATE_KEY = "tokenizer.chat_template"


@dataclass(frozen=True)
class VocabFacts:
    """What the model file says about its prompts, read once at load."""

    model_path: Path
    chat_template: str | None  # Jinja source from the GGUF metadata, None when it has none
    bos_text: str
    eos_text: str
    adds_bos: bool  # tokenizing prepends BOS (the model's add_bos_token)
    sampling_metadata: dict[str, str]  # the GGUF's general.sampling.* keys, if any


class Tokenizer:
    """Tokenizes prompts in a single worker thread; create with ``await Tokenizer.load(...)``."""

    def __init__(
        self, llama: llama_cpp.Llama, executor: ThreadPoolExecutor, facts: VocabFacts
    ) -> None:
        self._llama = llama
        self._executor = executor
        self._bos = llama.token_bos()
        self.facts = facts

    @classmethod
    async def load(cls, config: Config, model: str | None = None) -> Tokenizer:
        """Load the vocabulary of ``model`` (default: the served model) in the worker thread."""
        path = resolve_model_path(model or config.model)
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokenizer")
        loop = asyncio.get_running_loop()
        try:
            llama = await loop.run_in_executor(executor, _load_vocab, path)
            facts = await loop.run_in_executor(executor, _facts_of, llama, path)
        except BaseException:
            executor.shutdown(wait=False)
            raise
        log.info("tokenizer loaded", extra=fields(model=str(path), n_vocab=llama.n_vocab()))
        return cls(llama, executor, facts)

    async def tokenize(self, text: str) -> list[int]:
        """Token ids of ``text`` as the engine will see them: BOS added if the model's metadata
        asks for it, special tokens in the text parsed as such (chat templates rely on it)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._tokenize, text)

    async def tokenize_text(self, text: str, add_special_tokens: bool) -> list[int]:
        """``tokenize``, or without the BOS (``POST /tokenize``'s ``add_special_tokens``)."""
        if add_special_tokens:
            return await self.tokenize(text)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._ids, text, False, True)

    async def tokenize_inputs(self, texts: list[str]) -> list[list[int]]:
        """Token ids of texts to embed, in one call: BOS as the model's metadata asks, the
        texts as plain text (a control token's spelling is not one), as llama.cpp embeds."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._tokenize_inputs, texts)

    async def detokenize(self, token_ids: list[int]) -> str:
        """The text of ``token_ids`` together (special tokens spelled out); bytes that are
        not UTF-8 become U+FFFD."""
        loop = asyncio.get_running_loop()
        text = await loop.run_in_executor(self._executor, self._text, token_ids)
        return text.decode("utf-8", "replace")

    @property
    def n_vocab(self) -> int:
        return int(self._llama.n_vocab())

    async def tokenize_chat(self, prompt: ChatPrompt) -> list[int]:
        """Token ids of a rendered conversation: control tokens only from the template's
        markup, the messages' text as plain text (a 400 if that cannot be guaranteed)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._tokenize_chat, prompt)

    async def token_pieces(self, token_ids: list[int]) -> list[bytes]:
        """The bytes of each token on its own, special tokens spelled out (for logprobs)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._pieces, token_ids)

    async def grammar_problem(self, grammar: str) -> str | None:
        """Why llama.cpp cannot build a sampler for the GBNF ``grammar`` (root rule ``root``)
        with this vocabulary, or None when it can: the engine then never sees a bad one."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._grammar_problem, grammar)

    def close(self) -> None:
        """Stop the worker thread (after any call in flight) and free the vocabulary."""
        self._executor.shutdown(wait=True, cancel_futures=True)
        self._llama.close()

    def _tokenize(self, text: str) -> list[int]:
        return self._one_bos(self._ids(text, add_bos=True, special=True))

    def _tokenize_inputs(self, texts: list[str]) -> list[list[int]]:
        return [self._ids(text, add_bos=True, special=False) for text in texts]

    def _tokenize_chat(self, prompt: ChatPrompt) -> list[int]:
        for field, text in prompt.checked:
            if self._ids(text, add_bos=False, special=True) != self._ids(text, False, False):
                raise invalid(
                    f"{text[:40]!r} spells one of the model's control tokens where this model's "
                    "chat template renders it as markup (in tools or tool calls, or in a "
                    "message when the template alters message text), so it cannot be kept "
                    "plain text",
                    field,
                )
        ids: list[int] = []
        for part in prompt.parts:
            ids += self._ids(part.text, add_bos=not ids, special=part.markup)
        return self._one_bos(ids)

    def _ids(self, text: str, add_bos: bool, special: bool) -> list[int]:
        return list(self._llama.tokenize(text.encode("utf-8"), add_bos=add_bos, special=special))

    def _one_bos(self, ids: list[int]) -> list[int]:
        # A chat template that writes its own BOS, on a model whose tokenizer adds one too:
        # two BOS tokens put the model off, so keep one.
        if self.facts.adds_bos and ids[:2] == [self._bos, self._bos]:
            del ids[0]
        return ids

    def _grammar_problem(self, grammar: str) -> str | None:
        vocab = llama_cpp.llama_model_get_vocab(self._llama.model)
        with llama_log.captured() as said:
            sampler = llama_cpp.llama_sampler_init_grammar(vocab, grammar.encode("utf-8"), b"root")
        if sampler:
            llama_cpp.llama_sampler_free(sampler)
            return None
        return llama_log.grammar_error(said())

    def _text(self, token_ids: list[int]) -> bytes:
        self._check_ids(token_ids)
        return bytes(self._llama.detokenize(token_ids, special=True))

    def _pieces(self, token_ids: list[int]) -> list[bytes]:
        self._check_ids(token_ids)
        return [self._llama.detokenize([token], special=True) for token in token_ids]

    def _check_ids(self, token_ids: list[int]) -> None:
        """llama.cpp aborts the whole process on an id outside the vocabulary (an uncaught
        C++ exception): callers check ids for a 400 first, and this keeps a missed check to
        a failed request."""
        n_vocab = self.n_vocab
        bad = next((t for t in token_ids if not 0 <= t < n_vocab), None)
        if bad is not None:
            raise ValueError(f"token id {bad} is not in the vocabulary (size {n_vocab})")


def _load_vocab(path: Path) -> llama_cpp.Llama:
    # Ours before the load: llama-cpp-python's own prints llama.cpp's warnings to stderr, and
    # the vocabulary-only context it makes draws one that means nothing here ("n_ctx_seq
    # (512) > n_ctx_train (0) -- possible training context overflow").
    llama_log.route_llama_log()
    return llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)


def _facts_of(llama: llama_cpp.Llama, path: Path) -> VocabFacts:
    def text(token: int) -> str:
        return (
            llama.detokenize([token], special=True).decode("utf-8", "replace") if token >= 0 else ""
        )

    return VocabFacts(
        model_path=path,
        chat_template=llama.metadata.get(CHAT_TEMPLATE_KEY) or None,
        bos_text=text(llama.token_bos()),
        eos_text=text(llama.token_eos()),
        adds_bos=list(llama.tokenize(b"", add_bos=True)) == [llama.token_bos()],
        sampling_metadata={
            k: v for k, v in llama.metadata.items() if k.startswith("general.sampling.")
        },
    )
