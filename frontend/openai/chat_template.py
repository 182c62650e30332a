"""Chat prompts rendered with the model's own template (GGUF ``tokenizer.chat_template``).

Templates are Jinja2 written for Hugging Face's ``apply_chat_template``, so they are rendered
the same way: ``trim_blocks``/``lstrip_blocks``, ``messages``, ``add_generation_prompt``,
``bos_token``, ``eos_token``, ``raise_exception`` and ``strftime_now``. The environment is an
immutable sandbox: the template comes from a model file, and a model file from anywhere must
neither reach Python internals nor change the objects it is given.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, NoReturn

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from tinyserve.frontend.http.api_errors import invalid
from tinyserve.frontend.request.tokenizer import ChatPrompt, PromptPart, VocabFacts

log = logging.getLogger(__name__)

# Stands in for the k-th text a client wrote (a content or a name) in a second render that
# holds no client text at all, so every mark found in it is ours (see ``_fill``).
_MARK = "\x00tinyserve-text-{}\x00"
_MARK_PATTERN = re.compile("\x00tinyserve-text-(\\d+)\x00")
# What a template's own errors may raise besides jinja2's errors: it is code we did not write.
_RENDER_ERRORS = (jinja2.TemplateError, TypeError, ValueError, LookupError)


@dataclass(frozen=True)
class ChatMessage:
    """One message of a conversation, already checked (role in ``ROLES``, text content)."""

    role: str
    content: str
    name: str | None = None

    def as_dict(self) -> dict[str, str]:
        """The mapping a template iterates over, as Hugging Face passes it."""
        message = {"role": self.role, "content": self.content}
        if self.name is not None:
            message["name"] = self.name
        return message


def _raise_exception(message: str) -> NoReturn:
    # Templates call this to refuse a conversation (say, roles that do not alternate).
    raise jinja2.TemplateError(message)


def _tojson(value: Any, indent: int | None = None) -> str:
    # Jinja's own tojson escapes <, > and & for HTML; chat templates expect plain JSON.
    return json.dumps(value, ensure_ascii=False, indent=indent)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    env.filters["tojson"] = _tojson
    return env


class ChatTemplate:
    """The served model's chat template, compiled once; ``render`` turns messages into a prompt.

    A model without a template (or with one that does not compile) still serves completions;
    only chat requests fail, with a 400 that says why.
    """

    def __init__(self, source: str | None, bos_text: str = "", eos_text: str = "") -> None:
        self._template: jinja2.Template | None = None
        self._bos_text = bos_text
        self._eos_text = eos_text
        self.problem = "the model has no chat template (GGUF key tokenizer.chat_template)"
        if source is None:
            return
        try:
            self._template = _environment().from_string(source)
        except jinja2.TemplateError as exc:
            self.problem = f"the model's chat template does not compile: {exc}"
            log.error("chat template unusable: %s", exc)

    @classmethod
    def of_model(cls, facts: VocabFacts) -> ChatTemplate:
        """The template in the model file the tokenizer loaded."""
        return cls(facts.chat_template, facts.bos_text, facts.eos_text)

    def render(
        self,
        messages: list[ChatMessage],
        *,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
    ) -> ChatPrompt:
        """The prompt for ``messages``: with the assistant's header appended
        (``add_generation_prompt``), or open at the end of the final (assistant) message so the
        reply continues it. Raises a 400 ``ApiError`` when the template refuses the messages."""
        if self._template is None:
            raise invalid(f"chat completions are not available: {self.problem}", "messages")
        add_header = add_generation_prompt and not continue_final_message
        texts, marked_messages = _marked(messages)
        marked = self._render(marked_messages, add_header)
        if continue_final_message:
            # The final message's content: the last mark, or the one before its name's.
            final_mark = _MARK.format(len(texts) - (1 if messages[-1].name is None else 2))
            head, found, _ = marked.partition(final_mark)
            if not found:
                raise invalid("the chat template drops the final message; cannot continue it")
            marked = head + final_mark
        real = self._render(messages, add_header)
        for rendered_text in (_verbatim, _stripped):
            parts = _fill(marked, texts, rendered_text)
            text = "".join(part.text for part in parts)
            if text == real or (continue_final_message and real.startswith(text)):
                return ChatPrompt(parts)
        # The template rewrites what clients wrote: keep its output, have the texts checked.
        whole = "".join(p.text for p in _fill(marked, texts, _verbatim))
        return ChatPrompt((PromptPart(whole if continue_final_message else real, True),), texts)

    def _render(self, messages: list[ChatMessage], add_generation_prompt: bool) -> str:
        assert self._template is not None
        try:
            return self._template.render(
                messages=[m.as_dict() for m in messages],
                add_generation_prompt=add_generation_prompt,
                bos_token=self._bos_text,
                eos_token=self._eos_text,
            )
        except _RENDER_ERRORS as exc:
            raise invalid(f"the chat template refused the messages: {exc}", "messages") from exc


def _marked(messages: list[ChatMessage]) -> tuple[tuple[str, ...], list[ChatMessage]]:
    """The texts clients wrote (contents and names, in order), and the messages with a mark
    standing in for each of them."""
    texts: list[str] = []

    def mark(text: str) -> str:
        texts.append(text)
        return _MARK.format(len(texts) - 1)

    marked = [
        replace(m, content=mark(m.content), name=None if m.name is None else mark(m.name))
        for m in messages
    ]
    return tuple(texts), marked


def _verbatim(text: str) -> str:
    return text


def _stripped(text: str) -> str:
    return text.strip()  # templates that ``| trim`` contents (Llama 3's, among others)


def _fill(
    marked: str, texts: tuple[str, ...], rendered_text: Callable[[str], str]
) -> tuple[PromptPart, ...]:
    """``marked`` cut at its marks: markup between them, the client's text in their place."""
    pieces = _MARK_PATTERN.split(marked)  # markup, index, markup, index, ..., markup
    parts = []
    for i, piece in enumerate(pieces):
        text = rendered_text(texts[int(piece)]) if i % 2 else piece
        if text:
            parts.append(PromptPart(text, markup=not i % 2))
    return tuple(parts)
