"""``POST /tokenize``, ``POST /detokenize`` and ``GET /tokenizer_info``, in vLLM's shapes
(lm-evaluation-harness's ``tokenizer_backend=remote`` reads exactly these)."""

from __future__ import annotations

from typing import Annotated, Any, Self

from pydantic import ConfigDict, Field, model_validator

from tinyserve.frontend.models.chat import CONVERSATION_RULES, ConversationFields
from tinyserve.frontend.models.common import (
    Reply,
    Request,
    Text,
    cross_field,
    expect,
    schema_rule,
)
from tinyserve.frontend.models.conversation import ChatMessage
from tinyserve.frontend.models.fields import TokenId

# Exactly one of prompt and messages (not null); add_special_tokens with a text prompt only,
# the chat fields with messages only.
_CHAT_ONLY = {
    "add_generation_prompt": {"type": "null"},
    "continue_final_message": {"enum": [False, None]},  # null: the default, as everywhere
    "tools": {"maxItems": 0},
    "tool_choice": {"type": "null"},
}
_ONE_INPUT: dict[str, Any] = {
    "anyOf": [
        {"required": ["prompt"], "properties": {"prompt": {"type": "string"}}},
        {"required": ["messages"], "properties": {"messages": {"type": "array"}}},
    ],
    "not": {
        "required": ["prompt", "messages"],
        "properties": {"prompt": {"type": "string"}, "messages": {"type": "array"}},
    },
    "allOf": [
        schema_rule(
            "messages", {"type": "array"}, {"add_special_tokens": {"type": "null"}}, required=False
        ),
        schema_rule("prompt", {"type": "string"}, _CHAT_ONLY, required=False),
        *CONVERSATION_RULES,
    ],
}


class TokenizeRequest(ConversationFields):
    """Either ``prompt`` (text) or ``messages`` (rendered with the model's chat template, as
    ``/v1/chat/completions`` does, with its fields), not both."""

    model_config = ConfigDict(json_schema_extra=_ONE_INPUT)

    model: Text | None = Field(None, description="when given, the id GET /v1/models lists")
    prompt: Annotated[Text, expect("a string")] | None = Field(None, description="text")
    messages: Annotated[list[ChatMessage], Field(min_length=1)] | None = Field(
        None, description="a conversation, rendered with the model's chat template"
    )
    add_special_tokens: bool | None = Field(
        None,
        description="text only: add the model's BOS when its tokenizer does (default true); "
        "special tokens spelled in the text are parsed either way",
    )
    return_token_strs: bool = Field(False, description="also return each token's text")

    @model_validator(mode="after")
    def _prompt_or_messages(self) -> Self:
        if (self.prompt is None) == (self.messages is None):
            raise cross_field("prompt", "give exactly one of 'prompt' and 'messages'")
        if self.messages is not None and self.add_special_tokens is not None:
            message = "'add_special_tokens' applies to 'prompt' only"
            raise cross_field("add_special_tokens", message)
        if self.messages is not None:
            self.check_conversation(self.messages)
            return self
        for name in _CHAT_ONLY:
            if getattr(self, name) != type(self).model_fields[name].default:
                raise cross_field(name, f"'{name}' applies to 'messages' only")
        return self


class TokenizeReply(Reply):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeRequest(Request):
    model: Text | None = Field(None, description="when given, the id GET /v1/models lists")
    tokens: Annotated[list[TokenId], expect("a list of token ids >= 0")] = Field(
        description="token ids of the served model"
    )


class DetokenizeReply(Reply):
    prompt: str


class TokenizerInfo(Reply):
    """What a client needs to tokenize like the server without loading the tokenizer."""

    tokenizer_class: str
    model: str
    vocab_size: int
    model_max_length: int
    bos_token: str
    eos_token: str
    add_bos_token: bool
    chat_template: str | None
