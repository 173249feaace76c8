"""The reference repository builder and the settings the tensorrt_llm model reads back from its config."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from trtfleet_engines.reference.adapters import plan_cache
from trtfleet_engines.reference.engine import fit_limits, model_dimensions
from trtfleet_engines.reference.errors import RepositoryError
from trtfleet_engines.reference.kv_blocks import KvCacheSettings
from trtfleet_engines.reference.numpy_llama import LlamaConfig
from trtfleet_engines.reference.repository import (
    build_reference_repository,
    default_reference_spec,
    lora_cache_bytes_for,
)
from trtfleet_engines.reference.scheduler import BatchLimits
from trtfleet_engines.reference.settings import DEFAULT_GPU_MEMORY_BYTES, settings_from_model_config

from tests.unit.reference.fakes import triton_model_config
from trtfleet.api.basemodel import BaseModel, LoraModule
from trtfleet.loracache import adapter_pages, tier_pages

ROOT = Path(__file__).resolve().parents[3]


def _model_dir(tmp_path: Path) -> Path:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"hidden_size": 64}))
    return model


def test_default_spec_is_the_example_basemodel() -> None:
    example = yaml.safe_load((ROOT / "examples" / "basemodel-reference-tiny.yaml").read_text())
    assert BaseModel.model_validate(example).spec == default_reference_spec()


def test_repository_layout(tmp_path: Path) -> None:
    repo = build_reference_repository(tmp_path / "repo", model_dir=_model_dir(tmp_path))
    assert sorted(p.name for p in repo.iterdir()) == [
        "ensemble",
        "postprocessing",
        "preprocessing",
        "tensorrt_llm",
        "tensorrt_llm_bls",
    ]
    for name in ("preprocessing", "postprocessing", "tensorrt_llm", "tensorrt_llm_bls"):
        assert (repo / name / "1" / "model.py").is_file()
        assert (repo / name / "1" / "_trtfleet_bootstrap.py").is_file()
    assert not any((repo / "ensemble" / "1").iterdir())
    config = triton_model_config(repo / "tensorrt_llm" / "config.pbtxt")
    assert config["backend"] == "python"
    assert config["model_transaction_policy"]["decoupled"] is True
    inputs = {i["name"]: i for i in config["input"]}
    assert inputs["lora_weights"]["data_type"] == "TYPE_FP16"
    assert inputs["lora_config"]["dims"] == ["-1", "3"]
    assert inputs["lora_task_id"]["data_type"] == "TYPE_UINT64"


def test_settings_from_the_rendered_config(tmp_path: Path) -> None:
    model = _model_dir(tmp_path)
    repo = build_reference_repository(tmp_path / "repo", model_dir=model)
    settings = settings_from_model_config(triton_model_config(repo / "tensorrt_llm" / "config.pbtxt"))
    assert settings.model_dir == model.resolve()
    assert (settings.limits.max_batch_size, settings.limits.max_num_tokens) == (8, 2048)
    assert (settings.limits.max_input_len, settings.limits.max_seq_len, settings.limits.max_queue_size) == (
        128,
        256,
        64,
    )
    assert settings.exclude_input_in_output is True  # what the renderer writes
    lora = settings.lora
    assert lora is not None
    assert lora.target_modules[0] is LoraModule.ATTN_Q and len(lora.target_modules) == 7
    assert (lora.max_lora_rank, lora.optimal_adapter_size, lora.max_adapter_size) == (8, 8, 8)
    assert lora.host_bytes == 2 * 1024 * 1024
    assert lora.device_bytes == int(0.05 * DEFAULT_GPU_MEMORY_BYTES)
    assert settings.kv_cache == KvCacheSettings(max_blocks=8 * 256 // 32, tokens_per_block=32, enable_block_reuse=True)
    assert (settings.min_step_s, settings.prefill_s_per_token) == (0.0, 0.0)  # no pretend times unless asked


def test_pretend_step_and_prefill_times_reach_the_engine_settings(tmp_path: Path) -> None:
    repo = build_reference_repository(
        tmp_path / "repo", model_dir=_model_dir(tmp_path), min_step_ms=20, prefill_us_per_token=250
    )
    settings = settings_from_model_config(triton_model_config(repo / "tensorrt_llm" / "config.pbtxt"))
    assert settings.min_step_s == pytest.approx(0.020)
    assert settings.prefill_s_per_token == pytest.approx(250e-6)


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        pytest.param({"enable_kv_cache_reuse": "false"}, KvCacheSettings(64, 32, False), id="reuse-off"),
        pytest.param({"max_tokens_in_paged_kv_cache": "100", "reference_tokens_per_block": "16"},
                     KvCacheSettings(7, 16, True), id="size-and-block"),
        pytest.param({}, KvCacheSettings(64, 32, True), id="defaults"),
    ],
)
def test_kv_cache_parameters(params: dict[str, str], expected: KvCacheSettings) -> None:
    parameters = {"reference_model_dir": "/m", **params}
    config = {"max_batch_size": 8, "parameters": {k: {"string_value": v} for k, v in parameters.items()}}
    config["parameters"]["reference_max_seq_len"] = {"string_value": "256"}
    assert settings_from_model_config(config).kv_cache == expected


@pytest.mark.parametrize(
    ("params", "batcher", "expected"),
    [
        pytest.param({"reference_max_queue_size": "5"}, None, 5, id="parameter"),
        pytest.param({}, {"default_queue_policy": {"max_queue_size": 7}}, 7, id="hand-written-batcher"),
        pytest.param({"reference_max_queue_size": "5"}, {"default_queue_policy": {"max_queue_size": 7}}, 5,
                     id="parameter-wins"),
        pytest.param({}, None, 0, id="no-limit"),
    ],
)
def test_queue_limit_sources(params: dict[str, str], batcher: dict[str, object] | None, expected: int) -> None:
    parameters = {"reference_model_dir": "/m", **params}
    config: dict[str, object] = {
        "max_batch_size": 8,
        "parameters": {k: {"string_value": v} for k, v in parameters.items()},
    }
    if batcher is not None:
        config["dynamic_batching"] = batcher
    assert settings_from_model_config(config).limits.max_queue_size == expected


def test_kv_cache_overrides_reach_the_engine(tmp_path: Path) -> None:
    repo = build_reference_repository(tmp_path / "repo", model_dir=_model_dir(tmp_path), kv_tokens_per_block=16,
                                      kv_max_tokens=512, enable_kv_cache_reuse=False)
    settings = settings_from_model_config(triton_model_config(repo / "tensorrt_llm" / "config.pbtxt"))
    assert settings.kv_cache == KvCacheSettings(max_blocks=32, tokens_per_block=16, enable_block_reuse=False)


def test_overrides_for_small_caches_and_queues(tmp_path: Path) -> None:
    repo = build_reference_repository(
        tmp_path / "repo",
        model_dir=_model_dir(tmp_path),
        lora_cache_host_bytes=92_160,
        lora_cache_device_bytes=46_080,
        max_batch_size=3,
        max_queue_size=2,
        max_num_tokens=64,
    )
    settings = settings_from_model_config(triton_model_config(repo / "tensorrt_llm" / "config.pbtxt"))
    assert settings.lora is not None
    assert (settings.lora.host_bytes, settings.lora.device_bytes) == (92_160, 46_080)
    assert (
        settings.limits.max_batch_size,
        settings.limits.max_queue_size,
        settings.limits.max_num_tokens,
    ) == (3, 2, 64)


def test_a_directory_without_a_model_is_refused(tmp_path: Path) -> None:
    with pytest.raises(RepositoryError, match="no config.json"):
        build_reference_repository(tmp_path / "repo", model_dir=tmp_path)


def test_engine_limits_never_exceed_the_model_positions() -> None:

    config = LlamaConfig.from_hf_dict(
        {
            "hidden_size": 64,
            "intermediate_size": 176,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "vocab_size": 260,
            "max_position_embeddings": 256,
        }
    )
    limits = BatchLimits(max_batch_size=8, max_num_tokens=2048, max_input_len=256, max_seq_len=512)
    fitted = fit_limits(limits, config)
    assert (fitted.max_seq_len, fitted.max_input_len) == (256, 255)
    small = BatchLimits(max_batch_size=8, max_num_tokens=2048, max_input_len=100, max_seq_len=200)
    assert fit_limits(small, config) == small


def test_cache_bytes_for_a_number_of_adapters(tmp_path: Path) -> None:

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(
        json.dumps(
            {
                "hidden_size": 64,
                "intermediate_size": 176,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "head_dim": 16,
                "vocab_size": 260,
            }
        )
    )
    spec = default_reference_spec()
    host_bytes = lora_cache_bytes_for(3, spec, model_dir=model)
    repo = build_reference_repository(tmp_path / "repo", spec, model_dir=model, lora_cache_host_bytes=host_bytes)
    settings = settings_from_model_config(triton_model_config(repo / "tensorrt_llm" / "config.pbtxt"))
    assert settings.lora is not None

    plan = plan_cache(model_dimensions(LlamaConfig.from_hf_config(model)), settings.lora)
    per_adapter = adapter_pages(plan.geometry, rank=spec.lora.max_rank)
    assert tier_pages(plan.geometry, host_bytes) == plan.host_pages == 3 * per_adapter
    assert (plan.geometry.page_width, plan.geometry.slots_per_page, per_adapter) == (96, 240, 1)
