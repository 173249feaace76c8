"""Chat templates per architecture, and overrides."""

from __future__ import annotations

import pytest
from trtfleet_router.chat import BUILTIN_TEMPLATES, ChatMessage, PlaceholderTemplate, chat_renderer, parse_messages
from trtfleet_router.errors import MalformedRequest, UnsupportedParameter

DIALOG = [
    ChatMessage("system", "Be brief."),
    ChatMessage("user", "Hi {there}"),
    ChatMessage("assistant", "Hello."),
    ChatMessage("user", "Sum 2+2"),
]

EXPECTED = {
    "llama": "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
    "<|start_header_id|>user<|end_header_id|>\n\nHi {there}<|eot_id|>"
    "<|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|>"
    "<|start_header_id|>user<|end_header_id|>\n\nSum 2+2<|eot_id|>"
    "<|start_header_id|>assistant<|end_header_id|>\n\n",
    "mistral": "<s>[INST] Be brief.\n\nHi {there} [/INST] Hello.</s>[INST] Sum 2+2 [/INST]",
    "qwen2": "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi {there}<|im_end|>\n"
    "<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\nSum 2+2<|im_end|>\n"
    "<|im_start|>assistant\n",
    "gemma": "<bos><start_of_turn>user\nBe brief.\n\nHi {there}<end_of_turn>\n<start_of_turn>model\nHello."
    "<end_of_turn>\n<start_of_turn>user\nSum 2+2<end_of_turn>\n<start_of_turn>model\n",
    "phi3": "<|system|>\nBe brief.<|end|>\n<|user|>\nHi {there}<|end|>\n<|assistant|>\nHello.<|end|>\n"
    "<|user|>\nSum 2+2<|end|>\n<|assistant|>\n",
    "reference": "Sum 2+2",
}


@pytest.mark.parametrize("architecture", sorted(EXPECTED))
def test_builtin_templates(architecture: str) -> None:
    assert BUILTIN_TEMPLATES[architecture](DIALOG) == EXPECTED[architecture]


def test_mixtral_uses_mistral_and_unknown_uses_chatml() -> None:
    assert chat_renderer("mixtral")(DIALOG) == EXPECTED["mistral"]
    assert chat_renderer("something-new")(DIALOG) == EXPECTED["qwen2"]


def test_override_placeholders() -> None:
    render = chat_renderer("llama", "<s>{system}|{messages}<{role}>{content};{/messages}<assistant>")
    assert render(DIALOG) == "<s>Be brief.|<user>Hi {there};<assistant>Hello.;<user>Sum 2+2;<assistant>"
    assert chat_renderer("llama", "Q: {last_user}\nA:")(DIALOG) == "Q: Sum 2+2\nA:"


def test_override_must_be_well_formed() -> None:
    with pytest.raises(ValueError, match="messages"):
        PlaceholderTemplate("{messages}{role}")


def test_parse_messages() -> None:
    parsed = parse_messages(
        [
            {"role": "developer", "content": "rules"},
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        ]
    )
    assert parsed == [ChatMessage("system", "rules"), ChatMessage("user", "ab")]


@pytest.mark.parametrize(
    ("raw", "error"),
    [
        ([], MalformedRequest),
        ("hi", MalformedRequest),
        ([{"role": "wizard", "content": "x"}], MalformedRequest),
        ([{"role": "user", "content": 3}], MalformedRequest),
        ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}], UnsupportedParameter),
    ],
)
def test_parse_messages_errors(raw: object, error: type[Exception]) -> None:
    with pytest.raises(error):
        parse_messages(raw)


def test_reference_needs_a_user_message() -> None:
    with pytest.raises(MalformedRequest, match="user message"):
        BUILTIN_TEMPLATES["reference"]([ChatMessage("system", "x")])
