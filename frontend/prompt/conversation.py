"""A conversation (``models.conversation``) as the chat template takes it, and rendered.

A template with its own tool syntax (``structured.tool_syntax``) is given the tools, the
assistant's tool calls and the tools' results as Hugging Face's ``apply_chat_template``
gives them; any other gets the generic format of ``structured.tool_calls``: the tools
described in a system message (added to the first one when there is one), a call written in
the assistant's text, a tool's result as a user message. ``developer`` is ``system``.

A system message after the first turn (agents send them) stays where it is when the template
renders it there: what comes before it is then the prompt of the turns before, which the prefix
cache holds. A template that refuses it, or drops its text, gets it moved into the system
prompt instead, after the tools offered there.
"""

from __future__ import annotations

from tinyserve.frontend.models.conversation import ChatMessage, Conversation
from tinyserve.frontend.models.errors import ApiError
from tinyserve.frontend.prompt.chat_template import ChatPrompt, ChatTemplate, TemplateMessage
from tinyserve.frontend.structured import tool_calls


def render(template: ChatTemplate, conversation: Conversation) -> ChatPrompt:
    """The prompt of ``conversation``: ``template`` applied to it, given the tools itself when
    it has its own tool syntax."""
    own_tools = template.tool_syntax.own
    tools = None
    if own_tools and conversation.calls_tools:
        tools = [tool.model_dump(exclude_unset=True) for tool in conversation.tools]
    written = template_messages(conversation, own_tools)

    def rendered(these: list[TemplateMessage]) -> ChatPrompt:
        return template.render(
            these,
            tools=tools,
            add_generation_prompt=conversation.add_generation_prompt,
            continue_final_message=conversation.continue_final_message,
        )

    later = _later_system(written)
    if not later:
        return rendered(written)
    try:
        prompt = rendered(written)
        if all(message["content"].strip() in prompt.text for message in later):
            return prompt
    except ApiError:
        pass
    return rendered(_system_first(written))


def template_messages(conversation: Conversation, own_tools: bool = False) -> list[TemplateMessage]:
    """The messages as the template takes them: as they are for a template with its
    ``own_tools`` syntax, else in the generic format with the tools offered in a system
    message."""
    written = [_message(message, own_tools) for message in conversation.messages]
    if own_tools or not conversation.calls_tools:
        return written
    offer = tool_calls.tools_prompt(conversation.tools, conversation.tool_choice or "auto")
    if written[0]["role"] == "system":
        first = written[0]
        return [{**first, "content": f"{first['content']}\n\n{offer}"}, *written[1:]]
    return [{"role": "system", "content": offer}, *written]


def _message(message: ChatMessage, own_tools: bool) -> TemplateMessage:
    text, calls = message.text, message.tool_calls or []
    role = "system" if message.role == "developer" else message.role
    if not own_tools and message.role == "tool":
        role, text = "user", tool_calls.response_text(text)
    elif not own_tools and calls:
        written = "\n".join(tool_calls.call_text(call) for call in calls)
        text = f"{text}\n{written}" if text else written
    templated: TemplateMessage = {"role": role, "content": text}
    if message.name is not None:
        templated["name"] = message.name
    if own_tools and calls:
        templated["tool_calls"] = [tool_calls.template_call(call) for call in calls]
    if own_tools and message.tool_call_id is not None:
        templated["tool_call_id"] = message.tool_call_id
    return templated


def _lead(messages: list[TemplateMessage]) -> int:
    """How many system messages open ``messages``."""
    return next((i for i, m in enumerate(messages) if m["role"] != "system"), len(messages))


def _later_system(messages: list[TemplateMessage]) -> list[TemplateMessage]:
    return [m for m in messages[_lead(messages) :] if m["role"] == "system"]


def _system_first(messages: list[TemplateMessage]) -> list[TemplateMessage]:
    """``messages`` with every system message after the first other one moved into the
    system prompt (after its text and the tools offered there, in order): for a template
    that refuses a system message anywhere else."""
    lead = _lead(messages)
    later = _later_system(messages)
    head = "\n\n".join(m["content"] for m in [*messages[:lead], *later])
    rest = [m for m in messages[lead:] if m["role"] != "system"]
    return [{"role": "system", "content": head}, *rest]
