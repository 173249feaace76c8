"""The ``pytorch`` upstream's pure parts: the trtllm-serve request body, error classification, answers."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest
from trtfleet_router.chat import ChatMessage, chat_renderer
from trtfleet_router.discovery.static import FleetConfig, snapshot_from_config
from trtfleet_router.errors import OpenAIOnly
from trtfleet_router.models_registry import AdapterEntry, BaseModelEntry, EngineLimits, Target
from trtfleet_router.upstream.modelinfo import ModelInfoCache
from trtfleet_router.upstream.openai_upstream import (
    build_openai_body,
    choice_text,
    classify_answer,
    piece_message,
)
from trtfleet_router.upstream.protocol import FailureKind, SamplingParams, error_text, read_text
from trtfleet_router.upstream.text import TextGenerator, TextRequest
from trtfleet_router.upstream.waiting import Priority

from trtfleet.api.basemodel import Runtime

BASE = BaseModelEntry("tiny", "reference", EngineLimits(128, 256), chat_renderer("reference"), runtime=Runtime.PYTORCH)
ADAPTER = AdapterEntry("tiny-upper", "tiny", 7, "/data/upper", lora_path="/models/adapters/upper")


def test_completion_body_has_only_trtllm_serve_fields_and_the_lora_request() -> None:
    path, body = build_openai_body(
        Target(BASE, ADAPTER), "hi", None, SamplingParams(max_tokens=5, top_k=1, stop=("x",)), stream=True
    )
    assert path == "/v1/completions"
    assert body == {
        "model": "tiny",
        "prompt": "hi",
        "max_tokens": 5,
        "stream": True,
        "stream_options": {"include_usage": True},
        "top_k": 1,
        "stop": ["x"],
        "lora_request": {"lora_name": "tiny-upper", "lora_int_id": 7, "lora_path": "/models/adapters/upper"},
    }


def test_chat_body_keeps_the_messages_and_the_base_model_has_no_lora_request() -> None:
    messages = (ChatMessage("user", "hello"),)
    path, body = build_openai_body(
        Target(BASE, None), "rendered", messages, SamplingParams(max_tokens=3, temperature=0.5), stream=False
    )
    assert path == "/v1/chat/completions"
    assert body == {
        "model": "tiny",
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": 3,
        "stream": False,
        "temperature": 0.5,
    }


@pytest.mark.parametrize(
    ("engine_priority", "band", "expected"),
    [
        pytest.param(False, Priority.CRITICAL, None, id="fcfs pod: no priority field"),
        pytest.param(True, Priority.CRITICAL, 1.0, id="critical"),
        pytest.param(True, Priority.INTERACTIVE, 0.5, id="interactive: trtllm-serve's default"),
        pytest.param(True, Priority.SHEDDABLE, 0.25, id="sheddable"),
        pytest.param(True, Priority.BATCH, 0.0, id="batch"),
    ],
)
def test_a_priority_pod_gets_the_request_band_as_priority(
    engine_priority: bool, band: Priority, expected: float | None
) -> None:
    base = dataclasses.replace(BASE, engine_priority=engine_priority)
    request = TextRequest("r", Target(base, None), "hi", SamplingParams(max_tokens=2), False, 1, 5.0, priority=band)
    generator = TextGenerator.__new__(TextGenerator)  # call() needs no dispatcher for an OpenAI payload
    call = asyncio.run(generator.call(request))
    wire = call.payload.openai_json()
    assert wire is not None and wire.body.get("priority") == expected
    assert call.priority is band


@pytest.mark.parametrize(
    ("status", "message", "kind"),
    [
        (400, "1 validation error for CompletionRequest: Extra inputs are not permitted", FailureKind.INVALID),
        (400, "lora_path (/x) does not exist.", FailureKind.INVALID),
        (400, "PEFT Cache is full. Could not store taskId=3", FailureKind.CACHE_FULL),
        (400, "Maximum queue size of 8 has been reached", FailureKind.QUEUE_FULL),
        (503, "LLM is unavailable. Please check the server logs for more details.", FailureKind.POD_FAILED),
        (404, "Not Found", FailureKind.POD_FAILED),
        (500, "boom", FailureKind.POD_FAILED),
        (409, "odd", FailureKind.INTERNAL),
    ],
)
def test_error_answers_are_classified_by_text_then_status(status: int, message: str, kind: FailureKind) -> None:
    assert classify_answer(status, message).kind is kind


@pytest.mark.parametrize(
    ("body", "text"),
    [
        (b'{"error": "1 validation error"}', "1 validation error"),
        (b'{"object": "error", "message": "bad", "type": "BadRequestError", "code": 400}', "bad"),
        (b'{"error": {"message": "late", "type": "server_error"}}', "late"),
        (b"not json", "not json"),
    ],
)
def test_error_text_reads_every_error_shape(body: bytes, text: str) -> None:
    assert error_text(body) == text


@pytest.mark.parametrize(
    ("doc", "text"),
    [
        ({"choices": [{"index": 0, "text": "ab", "finish_reason": None}]}, "ab"),
        ({"choices": [{"index": 0, "delta": {"content": "cd"}}]}, "cd"),
        ({"choices": [{"index": 0, "delta": {"role": "assistant"}}]}, ""),
        ({"choices": [{"index": 0, "message": {"role": "assistant", "content": "ef"}}]}, "ef"),
        ({"choices": [], "usage": {"completion_tokens": 2}}, ""),
    ],
)
def test_choice_text(doc: dict[str, object], text: str) -> None:
    assert choice_text(doc) == text


def test_usage_becomes_the_engine_token_counts() -> None:
    piece = read_text(piece_message("xy", {"prompt_tokens": 4, "completion_tokens": 2}).infer_response)
    assert (piece.text, piece.input_tokens, piece.output_tokens) == ("xy", 4, 2)
    assert read_text(piece_message("z").infer_response).output_tokens is None


def test_triton_tensor_calls_for_a_pytorch_base_model_are_a_clear_400() -> None:
    cache = ModelInfoCache(None, None)  # type: ignore[arg-type]  # never reached: refused before any pod
    with pytest.raises(OpenAIOnly, match="use the OpenAI API"):
        asyncio.run(cache.config(BASE))
    with pytest.raises(OpenAIOnly):
        asyncio.run(cache.info(BASE))


def test_fleet_file_carries_runtime_and_lora_path(tmp_path: Path) -> None:
    peft = tmp_path / "upper"
    peft.mkdir()
    (peft / "adapter_config.json").write_text('{"r": 8}')
    (peft / "adapter_model.safetensors").write_bytes(b"\0" * 100)
    config = FleetConfig.model_validate(
        {
            "baseModels": [
                {
                    "name": "tiny",
                    "runtime": "pytorch",
                    "hostPages": 4,
                    "devicePages": 2,
                    "adapters": [
                        {"servedName": "a", "taskId": 1, "artifact": str(peft)},
                        {"servedName": "b", "taskId": 2, "artifact": str(peft), "loraPath": "/pods/see/b"},
                    ],
                },
                {"name": "trt", "adapters": [{"servedName": "c", "taskId": 3, "artifact": str(peft)}]},
            ]
        }
    )
    registry = snapshot_from_config(config).registry
    assert registry.bases["tiny"].serves_openai and not registry.bases["trt"].serves_openai
    a, b, c = (registry.adapters[n] for n in "abc")
    assert (a.lora_path, b.lora_path, c.lora_path) == (str(peft), "/pods/see/b", "")
    assert a.weights_bytes == 100 and a.ref.read_by_pod and not c.ref.read_by_pod
