"""A reasoning model's thinking, split off its reply (``reasoning_content``).

Reasoning models think first, between tags, then answer: ``<think>...</think>`` for Qwen 3,
QwQ and DeepSeek-R1 and its distills, another pair for a few families. The tags are the pair
the chat template writes, else ``<think>``'s. A reply's thinking is the text between them
when the reply begins with the opening tag, or from the start when the prompt itself ends
inside the block (generation prompts ending in ``<think>\\n``, as DeepSeek-R1's distills'
templates write); a block never closed (``max_tokens`` cut it) is thinking to the end.
Whitespace around the thinking, and between it and the answer, is left out.

A stream sends the thinking as it comes, holding back only what may still be the opening tag
at the start of the reply, or the closing tag (with the whitespace before it) at its end.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ReasoningTags:
    """The tags around a reply's thinking."""

    open: str
    close: str

    def opened_by(self, prompt: str) -> bool:
        """The prompt ends inside a block: the reply begins with thinking, without the tag."""
        return prompt.rstrip().endswith(self.open)


THINK = ReasoningTags("<think>", "</think>")
# The pairs of Magistral, Command R7B and Seed-OSS, as their published templates write them.
_OTHERS = (
    ReasoningTags("[THINK]", "[/THINK]"),
    ReasoningTags("<|START_THINKING|>", "<|END_THINKING|>"),
    ReasoningTags("<seed:think>", "</seed:think>"),
)


def detect_reasoning_tags(template: str | None) -> ReasoningTags:
    """The pair ``template`` writes; ``<think>``'s when it writes none of the others (the
    distilled models whose templates never mention their tags use those)."""
    found = (tags for tags in _OTHERS if template and tags.close in template)
    return next(found, THINK)


def held_from(text: str, tag: str) -> int:
    """Where the end of ``text`` that may still become ``tag`` begins, whitespace before it
    included: ``len(text)`` when nothing need wait."""
    cut = len(text)
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            cut -= n
            break
    return len(text[:cut].rstrip())


_START, _THINKING, _AFTER, _ANSWER = range(4)


class ReasoningSplit:
    """One reply's text, fed as it comes, split into thinking and answer."""

    def __init__(self, tags: ReasoningTags, opened: bool) -> None:
        self._tags = tags
        self._state = _THINKING if opened else _START
        self._held = ""
        self._thought = False  # thinking was sent: its leading whitespace is behind

    def feed(self, text: str) -> tuple[str, str]:
        """The (thinking, answer) that may be sent now."""
        self._held += text
        thinking = ""
        if self._state == _START:
            head = self._held.lstrip()
            if head.startswith(self._tags.open):
                self._state, self._held = _THINKING, head[len(self._tags.open) :]
            elif self._tags.open.startswith(head):
                return "", ""  # only whitespace yet, or maybe the tag
            else:
                self._state = _ANSWER
        if self._state == _THINKING:
            end = self._held.find(self._tags.close)
            if end < 0:
                keep = held_from(self._held, self._tags.close)
                return self._thinking(self._held[:keep], keep), ""
            thinking = self._thinking(self._held[:end].rstrip(), end + len(self._tags.close))
            self._state = _AFTER
        if self._state == _AFTER:
            self._held = self._held.lstrip()
            if not self._held:
                return thinking, ""
            self._state = _ANSWER
        answer, self._held = self._held, ""
        return thinking, answer

    def end(self) -> tuple[str, str]:
        """The (thinking, answer) held back until the reply ended."""
        held, self._held = self._held, ""
        if self._state == _THINKING:
            return self._thinking(held.rstrip(), 0), ""
        return "", held if self._state in (_START, _ANSWER) else ""

    def _thinking(self, text: str, taken: int) -> str:
        """``text`` as thinking to send, ``taken`` characters of the held text consumed."""
        self._held = self._held[taken:]
        if not self._thought:
            text = text.lstrip()
            self._thought = bool(text)
        return text
