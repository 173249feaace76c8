"""The LLM-API options rendered from a spec: each TorchLlmArgs key from its spec field."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import yaml
from trtfleet_engines.errors import SpecError, UnsupportedError
from trtfleet_engines.pytorch.options import build_llm_api_options, render_llm_api_options

from trtfleet.api.basemodel import BaseModelSpec


@pytest.mark.parametrize(
    ("patch", "path", "want"),
    [
        pytest.param({"parallelism": {"tensor": 2}, "engine": {"gpu": {"count": 2}}}, ("tensor_parallel_size",), 2,
                     id="tp"),
        pytest.param({"parallelism": {"pipeline": 2}, "engine": {"gpu": {"count": 2}}},
                     ("pipeline_parallel_size",), 2, id="pp"),
        pytest.param({"engine": {"maxBatchSize": 32}}, ("max_batch_size",), 32, id="batch"),
        pytest.param({"engine": {"maxBatchSize": 32}}, ("cuda_graph_config", "max_batch_size"), 32, id="graphs"),
        pytest.param({"engine": {"maxNumTokens": 4096}}, ("max_num_tokens",), 4096, id="tokens"),
        pytest.param({"engine": {"maxSeqLen": 8192}}, ("max_seq_len",), 8192, id="seq"),
        pytest.param({"dtype": "bfloat16"}, ("dtype",), "bfloat16", id="dtype"),
        pytest.param({"serving": {"kvCacheFreeGpuMemFraction": 0.5}},
                     ("kv_cache_config", "free_gpu_memory_fraction"), 0.5, id="kv-fraction"),
        pytest.param({"serving": {"enableKvCacheReuse": False}}, ("kv_cache_config", "enable_block_reuse"), False,
                     id="reuse"),
        pytest.param({"quantization": {"kvCacheDtype": "fp8"}}, ("kv_cache_config", "dtype"), "fp8", id="kv-fp8"),
        pytest.param({"serving": {"enableChunkedContext": False}}, ("enable_chunked_prefill",), False, id="chunked"),
        pytest.param({"lora": {"maxRank": 16}}, ("lora_config", "max_lora_rank"), 16, id="rank"),
        pytest.param({"lora": {"targetModules": ["attn_q"]}}, ("lora_config", "lora_target_modules"), ["attn_q"],
                     id="targets"),
        pytest.param({"lora": {"cache": {"maxAdapterSize": 32}}}, ("peft_cache_config", "max_adapter_size"), 32,
                     id="peft-max"),
        pytest.param({}, ("return_perf_metrics",), True, id="perf-metrics"),
        pytest.param({}, ("enable_iter_perf_stats",), True, id="iter-stats"),
    ],
)
def test_key_from_spec(make_spec: Callable[..., BaseModelSpec], patch: dict[str, Any], path: tuple[str, ...],
                       want: object) -> None:
    value: Any = build_llm_api_options(make_spec(patch))
    for key in path:
        value = value[key]
    assert value == want


def test_lora_disabled_has_no_lora_keys(make_spec: Callable[..., BaseModelSpec]) -> None:
    options = build_llm_api_options(make_spec({"lora": {"enabled": False}}))
    assert "lora_config" not in options and "peft_cache_config" not in options


def test_max_loras_come_from_the_capacity_plan(make_spec: Callable[..., BaseModelSpec]) -> None:
    lora = build_llm_api_options(make_spec())["lora_config"]
    assert 1 <= lora["max_loras"] <= lora["max_cpu_loras"]


def test_int8_kv_cache_is_refused(make_spec: Callable[..., BaseModelSpec]) -> None:
    with pytest.raises(UnsupportedError, match="int8"):
        build_llm_api_options(make_spec({"quantization": {"kvCacheDtype": "int8"}}))


def test_no_adapter_fits_is_refused(make_spec: Callable[..., BaseModelSpec]) -> None:
    with pytest.raises(SpecError, match="hostMemoryBytes"):
        build_llm_api_options(make_spec({"lora": {"cache": {"hostMemoryBytes": 1024}}}))


def test_render_is_deterministic_sorted_yaml(make_spec: Callable[..., BaseModelSpec]) -> None:
    text = render_llm_api_options(make_spec())
    assert text == render_llm_api_options(make_spec())
    loaded = yaml.safe_load(text)
    assert list(loaded) == sorted(loaded)
    assert loaded == build_llm_api_options(make_spec())
