"""OpenAI request translation and chunk building (pure)."""

from __future__ import annotations

from typing import Any

import pytest
from trtfleet_router.errors import MalformedRequest, UnsupportedParameter
from trtfleet_router.server.openai_protocol import ChunkFactory, completion_response, parse_chat, parse_completion
from trtfleet_router.upstream.protocol import SamplingParams
from trtfleet_router.upstream.text import Usage


def test_completion_translation() -> None:
    parsed = parse_completion(
        {
            "model": "a",
            "prompt": ["hello"],
            "max_tokens": 5,
            "temperature": 0.5,
            "top_p": 0.9,
            "seed": 3,
            "stop": "\n",
            "user": "ignored",
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    )
    assert parsed.prompt == "hello" and parsed.stream and parsed.include_usage
    assert parsed.sampling(5) == SamplingParams(max_tokens=5, temperature=0.5, top_p=0.9, seed=3, stop=("\n",))


def test_temperature_zero_is_greedy() -> None:
    params = parse_completion({"model": "a", "prompt": "x", "temperature": 0}).sampling(4)
    assert params.temperature is None and params.top_k == 1


def test_chat_translation_and_max_completion_tokens() -> None:
    parsed = parse_chat(
        {
            "model": "a",
            "messages": [{"role": "user", "content": "hi"}],
            "max_completion_tokens": 7,
            "max_tokens": 99,
            "n": 1,
            "logprobs": False,
        }
    )
    assert parsed.max_tokens == 7 and parsed.messages is not None and parsed.messages[0].content == "hi"
    assert not parse_chat(
        {"model": "a", "messages": [{"role": "user", "content": "hi"}], "stream_options": {"include_usage": True}}
    ).include_usage  # only with stream


@pytest.mark.parametrize(
    ("body", "error", "param"),
    [
        ({"model": "a", "prompt": "x", "n": 2}, UnsupportedParameter, "n"),
        ({"model": "a", "prompt": "x", "best_of": 3}, UnsupportedParameter, "best_of"),
        ({"model": "a", "prompt": "x", "logprobs": 2}, UnsupportedParameter, "logprobs"),
        ({"model": "a", "prompt": "x", "echo": True}, UnsupportedParameter, "echo"),
        ({"model": "a", "prompt": [1, 2, 3]}, UnsupportedParameter, "prompt"),
        ({"model": "a", "prompt": ["a", "b"]}, UnsupportedParameter, "prompt"),
        ({"model": "a", "prompt": 5}, MalformedRequest, "prompt"),
        ({"prompt": "x"}, MalformedRequest, "model"),
        ({"model": "a", "prompt": "x", "temperature": 3}, MalformedRequest, "temperature"),
        ({"model": "a", "prompt": "x", "max_tokens": 0}, MalformedRequest, "max_tokens"),
        ({"model": "a", "prompt": "x", "max_tokens": True}, MalformedRequest, "max_tokens"),
        ({"model": "a", "prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, MalformedRequest, "stop"),
        ({"model": "a", "prompt": "x", "stream": "yes"}, MalformedRequest, "stream"),
    ],
)
def test_completion_refusals(body: dict[str, Any], error: type[Exception], param: str) -> None:
    with pytest.raises(error) as info:
        parse_completion(body)
    assert getattr(info.value, "param", None) == param


@pytest.mark.parametrize(
    "body",
    [
        {"model": "a", "messages": [{"role": "user", "content": "x"}], "top_logprobs": 2},
        {"model": "a", "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]},
        {"model": "a", "messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_object"}},
    ],
)
def test_chat_refusals(body: dict[str, Any]) -> None:
    with pytest.raises(UnsupportedParameter):
        parse_chat(body)


def test_not_an_object() -> None:
    with pytest.raises(MalformedRequest, match="JSON object"):
        parse_completion(["model"])


def test_chunks() -> None:
    chat = ChunkFactory("chatcmpl-1", "m", 10, chat=True, include_usage=True)
    assert chat.role()["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chat.text("hi")["choices"][0]["delta"] == {"content": "hi"} and chat.text("hi")["usage"] is None
    assert chat.finish("stop")["choices"][0]["finish_reason"] == "stop"
    usage = chat.usage(Usage(3, 4))
    assert usage["choices"] == [] and usage["usage"] == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
    plain = ChunkFactory("cmpl-1", "m", 10, chat=False, include_usage=False)
    assert plain.text("x")["object"] == "text_completion" and "usage" not in plain.text("x")
    body = completion_response("cmpl-1", "m", "out", "length", Usage(1, 2), created=5)
    assert body["choices"][0] == {"index": 0, "text": "out", "logprobs": None, "finish_reason": "length"}
