"""The tool-call syntaxes of chat-template families, and which one a template uses.

A model trained for tools has a chat template that renders the offered tools and earlier
calls itself, and the model writes its calls the way that template renders them. The family is
read from the template's text, by the markers only that family's templates write (as
llama.cpp's chat parsers recognise theirs): rendering and parsing then agree with what the
model was trained on, where a format of our own would be one more thing for it to follow.

- Hermes, Qwen 2.5 and Qwen 3: ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``
  per call, text before them allowed.
- Llama 3.x: ``{"name": ..., "parameters": {...}}``, optionally after ``<|python_tag|>``;
  the template renders one call per message, so a reply holds one.
- Mistral (v3 tokenizers: 7B v0.3, Nemo): ``[TOOL_CALLS][{"name": ..., "arguments": ...}]``;
  call ids are 9 letters and digits, which the template checks when a call comes back.

Every other template (the default model's among them, and templates whose tool syntax is none
of these) gets the generic format of ``structured.tool_calls``, which is Hermes's syntax
offered in a system message.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class ToolSyntax:
    """How one family writes a reply's calls: ``marker list_open call (separator call)*
    list_close``, each call ``call_open {"name": ..., arguments_key: {...}} call_close``.

    The grammar writes exactly that (the marker only when ``writes_marker``); the parser also
    takes whitespace around each piece, either arguments key, and calls that begin the reply
    without their marker (llama.cpp does not spell control tokens in the text it returns, so
    a marker that is one never reaches us)."""

    family: str
    own: bool  # the template renders tools, calls and results itself
    marker: str  # where the calls begin; text before it is the reply's content
    writes_marker: bool
    list_open: str
    call_open: str
    call_close: str
    separator: str
    list_close: str
    arguments_key: str
    leading_text: bool  # content may come before the calls (else a reply is calls or text)
    single_call: bool  # the template renders one call per message
    short_ids: bool  # call ids of 9 letters and digits (Mistral's templates refuse others)

    @property
    def starts(self) -> tuple[str, ...]:
        """What a reply's calls begin with: the marker, or the first call without it."""
        bare = self.list_open or self.call_open.strip() or "{"
        return tuple(s for s in (self.marker.strip(), bare) if s)

    @property
    def anchor(self) -> str:
        """What calls after some text begin with (a bare ``{`` or ``[`` there is text)."""
        return self.starts[0]

    def mint_id(self) -> str:
        """A new call's id, of the form the family's template takes back."""
        return uuid.uuid4().hex[:9] if self.short_ids else f"call_{uuid.uuid4().hex[:24]}"


GENERIC = ToolSyntax(
    "generic", own=False, marker="", writes_marker=False, list_open="",
    call_open="<tool_call>\n", call_close="\n</tool_call>", separator="\n", list_close="",
    arguments_key="arguments", leading_text=False, single_call=False, short_ids=False,
)  # fmt: skip
# The generic format is Hermes's syntax; a template of the family also takes text before calls.
HERMES = replace(GENERIC, family="hermes", own=True, leading_text=True)
LLAMA3 = ToolSyntax(
    "llama3", own=True, marker="<|python_tag|>", writes_marker=False, list_open="",
    call_open="", call_close="", separator="; ", list_close="",
    arguments_key="parameters", leading_text=True, single_call=True, short_ids=False,
)  # fmt: skip
MISTRAL = ToolSyntax(
    "mistral", own=True, marker="[TOOL_CALLS]", writes_marker=True, list_open="[",
    call_open="", call_close="", separator=", ", list_close="]",
    arguments_key="arguments", leading_text=True, single_call=False, short_ids=True,
)  # fmt: skip

_TAKES_TOOLS = re.compile(r"\btools\b")


def detect_tool_syntax(template: str | None) -> ToolSyntax:
    """The syntax of the template's family; the generic one for a template that takes no
    ``tools`` or writes no syntax we know.

    Markers, from the families' published templates: Mistral's write ``[TOOL_CALLS]`` (its
    newer ``[TOOL_CALLS]name[ARGS]{...}`` syntax is not this one), Hermes's and Qwen's
    ``<tool_call>``, Llama 3.x's a turn of the ``ipython`` role for tool results."""
    if template is None or not _TAKES_TOOLS.search(template):
        return GENERIC
    if "[TOOL_CALLS]" in template:
        return GENERIC if "[ARGS]" in template else MISTRAL
    if "<tool_call>" in template:
        return HERMES
    if "<|start_header_id|>ipython<|end_header_id|>" in template:
        return LLAMA3
    return GENERIC
