"""Chat templates: OpenAI ``messages`` -> one prompt string, per model architecture (pure).

Built-in templates (``BUILTIN_TEMPLATES``): ``llama`` (Llama-3 header tokens), ``mistral``/``mixtral``
(``[INST]``), ``qwen2`` (ChatML), ``gemma``, ``phi3`` and ``reference`` (trtfleet's tiny reference model,
whose prompt is just the last user message). A BaseModel's ``serving.chatTemplate`` overrides the
built-in one with a small placeholder format (no code runs, braces in message text are safe)::

    {system}                      the system message's content ("" when none)
    {messages} ... {/messages}    rendered once per non-system message, with {role} and {content}
    {last_user}                   the content of the last user message

Example: ``"<s>{system}\\n{messages}<|{role}|>{content}\\n{/messages}<|assistant|>"``. The engine adds
nothing: the template must include any BOS marker the model expects.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from trtfleet_router.errors import MalformedRequest, UnsupportedParameter


@dataclass(frozen=True, slots=True)
class ChatMessage:
    role: str
    content: str


ROLES: Final = frozenset({"system", "developer", "user", "assistant", "tool"})


def parse_messages(raw: object) -> list[ChatMessage]:
    """OpenAI ``messages`` (content as a string or a list of text parts) -> :class:`ChatMessage` list."""
    if not isinstance(raw, list) or not raw:
        raise MalformedRequest("'messages' must be a non-empty list", param="messages")
    messages = []
    for index, item in enumerate(raw):
        if not isinstance(item, dict):
            raise MalformedRequest(f"messages[{index}] must be an object", param="messages")
        role = item.get("role")
        if role not in ROLES:
            raise MalformedRequest(f"messages[{index}].role must be one of {sorted(ROLES)}", param="messages")
        messages.append(ChatMessage("system" if role == "developer" else str(role), _content(item, index)))
    return messages


def _content(item: Mapping[str, Any], index: int) -> str:
    content = item.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise UnsupportedParameter(
                    f"messages[{index}].content: only text parts are supported", param="messages"
                )
            texts.append(part["text"])
        return "".join(texts)
    raise MalformedRequest(f"messages[{index}].content must be a string or a list of parts", param="messages")


def _system(messages: Sequence[ChatMessage]) -> str:
    return "\n\n".join(m.content for m in messages if m.role == "system")


def _dialog(messages: Sequence[ChatMessage]) -> list[ChatMessage]:
    return [m for m in messages if m.role != "system"]


def last_user_message(messages: Sequence[ChatMessage]) -> str:
    for message in reversed(messages):
        if message.role == "user":
            return message.content
    raise MalformedRequest("'messages' needs at least one user message", param="messages")


def render_llama3(messages: Sequence[ChatMessage]) -> str:
    parts = ["<|begin_of_text|>"]
    for m in messages:
        parts.append(f"<|start_header_id|>{m.role}<|end_header_id|>\n\n{m.content}<|eot_id|>")
    parts.append("<|start_header_id|>assistant<|end_header_id|>\n\n")
    return "".join(parts)


def render_mistral(messages: Sequence[ChatMessage]) -> str:
    system = _system(messages)
    parts = ["<s>"]
    first_user = True
    for m in _dialog(messages):
        if m.role == "assistant":
            parts.append(f" {m.content}</s>")
            continue
        text = f"{system}\n\n{m.content}" if first_user and system else m.content
        first_user = False
        parts.append(f"[INST] {text} [/INST]")
    return "".join(parts)


def render_chatml(messages: Sequence[ChatMessage]) -> str:
    parts = [f"<|im_start|>{m.role}\n{m.content}<|im_end|>\n" for m in messages]
    parts.append("<|im_start|>assistant\n")
    return "".join(parts)


def render_gemma(messages: Sequence[ChatMessage]) -> str:
    system = _system(messages)
    parts = ["<bos>"]
    first_user = True
    for m in _dialog(messages):
        role = "model" if m.role == "assistant" else "user"
        text = f"{system}\n\n{m.content}" if first_user and system and role == "user" else m.content
        first_user = first_user and role != "user"
        parts.append(f"<start_of_turn>{role}\n{text}<end_of_turn>\n")
    parts.append("<start_of_turn>model\n")
    return "".join(parts)


def render_phi3(messages: Sequence[ChatMessage]) -> str:
    parts = [f"<|{m.role}|>\n{m.content}<|end|>\n" for m in messages]
    parts.append("<|assistant|>\n")
    return "".join(parts)


def render_reference(messages: Sequence[ChatMessage]) -> str:
    return last_user_message(messages)


ChatRenderer = Callable[[Sequence[ChatMessage]], str]

BUILTIN_TEMPLATES: Final[dict[str, ChatRenderer]] = {
    "llama": render_llama3,
    "mistral": render_mistral,
    "mixtral": render_mistral,
    "qwen2": render_chatml,
    "gemma": render_gemma,
    "phi3": render_phi3,
    "reference": render_reference,
}


@dataclass(frozen=True, slots=True)
class PlaceholderTemplate:
    """A ``serving.chatTemplate`` override (see the module docstring)."""

    text: str

    def __post_init__(self) -> None:
        opens, closes = self.text.count("{messages}"), self.text.count("{/messages}")
        if opens != closes or opens > 1:
            raise ValueError("a chat template needs at most one '{messages} ... {/messages}' section")

    def __call__(self, messages: Sequence[ChatMessage]) -> str:
        head, body, tail = self.text, "", ""
        if "{messages}" in self.text:
            head, rest = self.text.split("{messages}", 1)
            body, tail = rest.split("{/messages}", 1)
        rendered = [body.replace("{role}", m.role).replace("{content}", m.content) for m in _dialog(messages)]
        return _fill(head, messages) + "".join(rendered) + _fill(tail, messages)


def _fill(text: str, messages: Sequence[ChatMessage]) -> str:
    if "{system}" in text:
        text = text.replace("{system}", _system(messages))
    if "{last_user}" in text:
        text = text.replace("{last_user}", last_user_message(messages))
    return text


def chat_renderer(architecture: str, override: str | None = None) -> ChatRenderer:
    """The override when given, else the architecture's built-in template (ChatML when unknown)."""
    if override:
        return PlaceholderTemplate(override)
    return BUILTIN_TEMPLATES.get(architecture, render_chatml)
