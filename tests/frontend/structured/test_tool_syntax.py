"""Which tool-call syntax a chat template uses, read from its text."""

from __future__ import annotations

import pytest

from tests.chat_templates import DEEPSEEK_R1_DISTILL, LLAMA32, MISTRAL_NEMO, QWEN3
from tinyserve.frontend.structured.tool_syntax import (
    GENERIC,
    HERMES,
    LLAMA3,
    MISTRAL,
    ToolSyntax,
    detect_tool_syntax,
)

# SmolLM2's (the default model's) template: ChatML, no tools.
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# Mistral's newer syntax ([TOOL_CALLS]name[ARGS]{...}), as its templates write a call.
MISTRAL_V11 = "{% if tools %}[AVAILABLE_TOOLS]{% endif %}[TOOL_CALLS]{{ name }}[ARGS]{{ args }}"


@pytest.mark.parametrize(
    ("template", "syntax"),
    [
        (QWEN3, HERMES),
        (LLAMA32, LLAMA3),
        (MISTRAL_NEMO, MISTRAL),
        (DEEPSEEK_R1_DISTILL, GENERIC),  # its own syntax, but it takes no tools
        (CHATML, GENERIC),
        (MISTRAL_V11, GENERIC),
        ("{# <tool_call> written, but no tool list taken #}", GENERIC),
        (None, GENERIC),
    ],
)
def test_detected_from_the_template(template: str | None, syntax: ToolSyntax) -> None:
    assert detect_tool_syntax(template) is syntax


def test_where_calls_begin() -> None:
    assert HERMES.starts == GENERIC.starts == ("<tool_call>",)
    assert LLAMA3.starts == ("<|python_tag|>", "{") and LLAMA3.anchor == "<|python_tag|>"
    assert MISTRAL.starts == ("[TOOL_CALLS]", "[")
