"""The real tiny Llama behind the in-flight batcher, in process: batching never changes a request's tokens."""

from __future__ import annotations

from pathlib import Path

import pytest
from trtfleet_engines.reference.engine import build_batcher
from trtfleet_engines.reference.numpy_llama import TINY_LLAMA_DIR
from trtfleet_engines.reference.repository import build_reference_repository, lora_cache_bytes_for
from trtfleet_engines.reference.scheduler import GenerationRequest, InflightBatcher, LoraInputs
from trtfleet_engines.reference.settings import EngineSettings, settings_from_model_config
from trtfleet_engines.reference.tokenizer import EOS_ID, decode, prompt_ids

from tests.integration.reference.tiny import sample_adapters
from tests.unit.reference.fakes import triton_model_config

PROMPTS = ("hello world", "tiny llama", "abc")


@pytest.fixture(scope="module")
def settings(tmp_path_factory: pytest.TempPathFactory) -> EngineSettings:
    repo = build_reference_repository(tmp_path_factory.mktemp("repo"), lora_cache_host_bytes=lora_cache_bytes_for(4))
    return settings_from_model_config(triton_model_config(Path(repo) / "tensorrt_llm" / "config.pbtxt"))


def _request(text: str, task_id: int | None, with_weights: bool) -> GenerationRequest:
    lora = None
    if task_id is not None:
        adapter = list(sample_adapters().values())[task_id - 1]
        lora = LoraInputs(task_id, adapter.weights, adapter.config) if with_weights else LoraInputs(task_id)
    return GenerationRequest(
        prompt=tuple(prompt_ids(text)), max_new_tokens=64, end_id=EOS_ID, exclude_input_in_output=True, lora=lora
    )


def _run(batcher: InflightBatcher[tuple[int | None, str]]) -> dict[tuple[int | None, str], str]:
    out = {}
    while batcher.has_work():
        for response in batcher.step():
            assert response.error is None, response.error
            if response.final:
                out[response.handle] = decode(response.output_ids)
    return out


def test_a_mixed_batch_gives_each_request_its_tokens_alone(settings: EngineSettings) -> None:
    assert settings.model_dir == TINY_LLAMA_DIR.resolve()
    batcher: InflightBatcher[tuple[int | None, str]] = build_batcher(settings)
    jobs = [(task, text) for task in (None, 1, 2, 3) for text in PROMPTS]
    alone = {}
    for task, text in jobs:
        batcher.submit(_request(text, task, with_weights=True), (task, text))
        alone.update(_run(batcher))
    assert alone[(None, "hello world")] == "hello world"
    for task, text in jobs:
        batcher.submit(_request(text, task, with_weights=False), (task, text))
    together = _run(batcher)
    assert together == alone
    assert batcher.stats().iterations > 0
