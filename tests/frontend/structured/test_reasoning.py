"""Thinking split off a reply: which tags a template uses, what a whole reply splits into, and
what a stream holds back (never more than what may still be a tag)."""

from __future__ import annotations

import pytest

from tests.chat_templates import DEEPSEEK_R1_DISTILL, QWEN3
from tinyserve.frontend.structured.reasoning import (
    THINK,
    ReasoningSplit,
    ReasoningTags,
    detect_reasoning_tags,
)

MAGISTRAL_LIKE = "{{ '[THINK]' }}{{ messages[0].content }}{{ '[/THINK]' }}"


def split(text: str, tags: ReasoningTags = THINK, opened: bool = False) -> tuple[str, str]:
    """A whole reply, split."""
    splitter = ReasoningSplit(tags, opened)
    head, tail = splitter.feed(text), splitter.end()
    return head[0] + tail[0], head[1] + tail[1]


def test_tags_come_from_the_template() -> None:
    assert detect_reasoning_tags(QWEN3) == THINK
    assert detect_reasoning_tags(DEEPSEEK_R1_DISTILL) == THINK
    assert detect_reasoning_tags(MAGISTRAL_LIKE) == ReasoningTags("[THINK]", "[/THINK]")
    assert detect_reasoning_tags(None) == THINK  # distills whose templates never say


def test_a_generation_prompt_can_open_the_block() -> None:
    assert THINK.opened_by("<｜Assistant｜><think>\n")  # noqa: RUF001  (DeepSeek's bars)
    assert not THINK.opened_by("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not THINK.opened_by("<|im_start|>assistant\n")


@pytest.mark.parametrize(
    ("text", "opened", "thinking", "answer"),
    [
        ("<think>\nWhy? Because.\n</think>\n\nHello.", False, "Why? Because.", "Hello."),
        ("  <think>a</think>b", False, "a", "b"),
        ("Hello <think>a</think>", False, "", "Hello <think>a</think>"),  # not at the start
        ("a lot\n</think>\n\nb", True, "a lot", "b"),
        ("cut short by max_tok", True, "cut short by max_tok", ""),
        ("<think>cut short</thi", False, "cut short</thi", ""),
        ("<think></think>", False, "", ""),
        ("<thin", False, "", "<thin"),
        ("  plain\n", False, "", "  plain\n"),  # a reply without a block is left as it was
        ("", False, "", ""),
    ],
)
def test_whole_replies(text: str, opened: bool, thinking: str, answer: str) -> None:
    assert split(text, opened=opened) == (thinking, answer)


def test_another_pair_of_tags() -> None:
    tags = ReasoningTags("[THINK]", "[/THINK]")
    assert split("[THINK]hm[/THINK]yes", tags) == ("hm", "yes")


def test_a_stream_holds_back_only_what_may_be_a_tag() -> None:
    splitter = ReasoningSplit(THINK, opened=False)
    sent = [
        splitter.feed(piece) for piece in ("<th", "ink>\nI", " see.\n</", "thi", "nk>", "\n\nOk")
    ]
    assert sent == [("", ""), ("I", ""), (" see.", ""), ("", ""), ("", ""), ("", "Ok")]
    assert splitter.end() == ("", "")
    plain = ReasoningSplit(THINK, opened=False)
    assert [plain.feed(piece) for piece in ("<", "b>", "!")] == [("", ""), ("", "<b>"), ("", "!")]
