"""Chat prompts rendered with the model's own template (GGUF ``tokenizer.chat_template``).

Templates are Jinja2 written for Hugging Face's ``apply_chat_template``, so they are rendered
the same way: ``trim_blocks``/``lstrip_blocks``, ``messages``, ``tools``,
``add_generation_prompt``, ``bos_token``, ``eos_token``, ``raise_exception`` and
``strftime_now``. The environment is an immutable sandbox: the template comes from a model
file, and a model file from anywhere must neither reach Python internals nor change the
objects it is given.

The template's text also says how the model writes tool calls and thinking
(``structured.tool_syntax``, ``structured.reasoning``), read once here; ``reply_parser``
hands that to whoever reads a reply.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NoReturn, NotRequired, Protocol, TypedDict

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from tinyserve.frontend.models.errors import invalid
from tinyserve.frontend.structured.reasoning import detect_reasoning_tags
from tinyserve.frontend.structured.reply_parser import ReplyParser
from tinyserve.frontend.structured.tool_syntax import detect_tool_syntax

log = logging.getLogger(__name__)

# Stands in for the k-th text a client wrote (a content or a name) in a second render that
# holds no client text at all, so every mark found in it is ours (see ``_fill``).
_MARK = "\x00tinyserve-text-{}\x00"
_MARK_PATTERN = re.compile("\x00tinyserve-text-(\\d+)\x00")
# What a template's own errors may raise besides jinja2's errors: it is code we did not write.
_RENDER_ERRORS = (jinja2.TemplateError, TypeError, ValueError, LookupError)


class TemplateFacts(Protocol):
    """What a model file says that its chat template needs (``tokenizer.VocabFacts``)."""

    @property
    def chat_template(self) -> str | None: ...
    @property
    def bos_text(self) -> str: ...
    @property
    def eos_text(self) -> str: ...


class TemplateMessage(TypedDict):
    """One message as a template iterates over it, as Hugging Face passes it: already checked
    (role, text content); an assistant's ``tool_calls`` and a tool result's ``tool_call_id``
    for templates with their own tool syntax (templates ask whether the key is there)."""

    role: str
    content: str
    name: NotRequired[str]
    tool_calls: NotRequired[list[dict[str, Any]]]
    tool_call_id: NotRequired[str]


@dataclass(frozen=True)
class PromptPart:
    """A run of a rendered prompt: the template's own ``markup`` (its control tokens are
    meant), or text a client wrote (tokenized as plain text, whatever it spells)."""

    text: str
    markup: bool


@dataclass(frozen=True)
class ChatPrompt:
    """A rendered conversation, kept in parts so that a message can never smuggle the model's
    control tokens (``<|im_start|>``…) into the prompt: only markup parts are parsed for them.

    ``checked`` holds client texts rendered inside markup, each with the request field it came
    from, which the tokenizer refuses if they spell any control token: tools and tool calls,
    which templates write as JSON, and every text when a template alters the messages' text
    beyond trimming it (so the parts cannot be told apart and the whole prompt is one markup
    part).
    """

    parts: tuple[PromptPart, ...]
    checked: tuple[tuple[str, str], ...] = ()  # (field, text)

    @property
    def text(self) -> str:
        return "".join(part.text for part in self.parts)


def _raise_exception(message: str) -> NoReturn:
    # Templates call this to refuse a conversation (say, roles that do not alternate).
    raise jinja2.TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # Jinja's own tojson escapes <, > and & for HTML; chat templates expect plain JSON, with
    # the arguments Hugging Face's filter takes.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _environment() -> ImmutableSandboxedEnvironment:
    # loopcontrols: {% break %} and {% continue %}, which Hugging Face's environment has.
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
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
        self.tool_syntax = detect_tool_syntax(source)
        self.reasoning_tags = detect_reasoning_tags(source)
        self.problem = "the model has no chat template (GGUF key tokenizer.chat_template)"
        if source is None:
            return
        try:
            self._template = _environment().from_string(source)
        except jinja2.TemplateError as exc:
            self.problem = f"the model's chat template does not compile: {exc}"
            log.error("chat template unusable: %s", exc)

    @classmethod
    def of_model(cls, facts: TemplateFacts) -> ChatTemplate:
        """The template in the model file the tokenizer loaded."""
        return cls(facts.chat_template, facts.bos_text, facts.eos_text)

    def render(
        self,
        messages: list[TemplateMessage],
        *,
        tools: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
    ) -> ChatPrompt:
        """The prompt for ``messages`` (and ``tools``, given to a template with its own tool
        syntax): with the assistant's header appended (``add_generation_prompt``), or open at
        the end of the final (assistant) message so the reply continues it. Raises a 400
        ``ApiError`` when the template refuses the messages."""
        if self._template is None:
            raise invalid(f"chat completions are not available: {self.problem}", "messages")
        add_header = add_generation_prompt and not continue_final_message
        texts, marked_messages, final_mark = _marked(messages, continue_final_message)
        marked = self._render(marked_messages, tools, add_header)
        if continue_final_message:
            head, found, _ = marked.partition(final_mark)
            if not found:
                raise invalid("the chat template drops the final message; cannot continue it")
            marked = head + final_mark
        real = self._render(messages, tools, add_header)
        # Tools and calls are rendered as the template writes them (JSON, mostly): their
        # texts cannot be told apart from the markup, so the tokenizer checks them.
        calls = _strings([(m.get("tool_calls"), m.get("tool_call_id")) for m in messages])
        checked = _field("tools", _strings(tools)) + _field("messages", calls)
        for rendered_text in (_verbatim, _stripped):
            parts = _fill(marked, texts, rendered_text)
            text = "".join(part.text for part in parts)
            if text == real or (continue_final_message and real.startswith(text)):
                return ChatPrompt(parts, checked)
        # The template rewrites what clients wrote: keep its output, have the texts checked.
        whole = "".join(p.text for p in _fill(marked, texts, _verbatim))
        prompt = whole if continue_final_message else real
        return ChatPrompt((PromptPart(prompt, True),), _field("messages", texts) + checked)

    def reply_parser(self, prompt: ChatPrompt, tools: bool, reasoning_format: str) -> ReplyParser:
        """How the reply to ``prompt`` is read: for tool calls in this template's syntax when
        ``tools`` were offered, for thinking in its tags unless ``reasoning_format`` (the
        flag's) is ``none``."""
        tags = None if reasoning_format == "none" else self.reasoning_tags
        opened = tags is not None and tags.opened_by(prompt.text)
        return ReplyParser(self.tool_syntax if tools else None, tags, opened)

    def _render(
        self, messages: list[TemplateMessage], tools: list[dict[str, Any]] | None, header: bool
    ) -> str:
        assert self._template is not None
        try:
            return self._template.render(
                messages=messages,
                tools=tools,
                add_generation_prompt=header,
                bos_token=self._bos_text,
                eos_token=self._eos_text,
            )
        except _RENDER_ERRORS as exc:
            raise invalid(f"the chat template refused the messages: {exc}", "messages") from exc


def _marked(
    messages: list[TemplateMessage], continued: bool
) -> tuple[tuple[str, ...], list[TemplateMessage], str]:
    """The texts clients wrote (contents and names, in order), the messages with a mark
    standing in for each of them, and the mark of the final content when it is ``continued``.
    Empty texts keep no mark (templates test contents for emptiness), but the one continued."""
    texts: list[str] = []

    def mark(text: str, always: bool = False) -> str:
        if not text and not always:
            return text
        texts.append(text)
        return _MARK.format(len(texts) - 1)

    def marked(message: TemplateMessage, content: str) -> TemplateMessage:
        copy: TemplateMessage = {**message, "content": content}
        if "name" in message:
            copy["name"] = mark(message["name"])
        return copy

    fronts = [marked(m, mark(m["content"])) for m in messages[:-1]]
    final = messages[-1]
    final_mark = mark(final["content"], always=continued)
    return tuple(texts), [*fronts, marked(final, final_mark)], final_mark


def _field(field: str, texts: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    return tuple((field, text) for text in texts)


def _strings(value: Any) -> tuple[str, ...]:
    """Every string in ``value`` (lists, tuples, mappings' keys and values), once each."""
    found: dict[str, None] = {}
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            found[item] = None
        elif isinstance(item, dict):
            stack += [*item.keys(), *item.values()]
        elif isinstance(item, list | tuple):
            stack += item
    return tuple(found)


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
