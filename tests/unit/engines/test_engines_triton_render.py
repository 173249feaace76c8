"""Rendered Triton configs: they parse as ModelConfig, carry the engine dtype and fill every parameter."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2
from trtfleet_engines.errors import RenderError
from trtfleet_engines.triton import MODEL_NAMES, render_configs, render_model_repository

from trtfleet.api.basemodel import BaseModelSpec

MakeSpec = Callable[..., BaseModelSpec]
ENGINE = "/trtfleet/artifact/engine"
DataType = model_config_pb2.DataType


def _parse(text: str) -> model_config_pb2.ModelConfig:
    return text_format.Parse(text, model_config_pb2.ModelConfig())


def _params(config: model_config_pb2.ModelConfig) -> dict[str, str]:
    return {key: value.string_value for key, value in config.parameters.items()}


def _inputs(config: model_config_pb2.ModelConfig) -> dict[str, model_config_pb2.ModelInput]:
    return {tensor.name: tensor for tensor in config.input}


@pytest.mark.parametrize(
    "patch", [{}, {"dtype": "bfloat16"}, {"lora": {"enabled": False}}, {"runtime": "reference"}]
)
def test_every_config_parses_and_is_filled(make_spec: MakeSpec, patch: dict[str, object]) -> None:
    configs = render_configs(make_spec(patch), ENGINE)
    assert sorted(configs) == sorted(MODEL_NAMES)
    for name, text in configs.items():
        assert "${" not in text
        config = _parse(text)
        assert config.name == name
        assert config.max_batch_size == 64
        empty = {key for key, value in _params(config).items() if value == ""}
        # "" is how these read "none": preprocessing's multimodal model, the C++ backend's guided decoding
        assert empty <= {"multimodal_model_path", "xgrammar_tokenizer_info_path", "guided_decoding_backend"}, (
            name,
            empty,
        )


@pytest.mark.parametrize(
    ("dtype", "expected"), [("float16", DataType.TYPE_FP16), ("bfloat16", DataType.TYPE_BF16)]
)
def test_lora_weights_carry_the_engine_dtype_everywhere(
    make_spec: MakeSpec, dtype: str, expected: int
) -> None:
    configs = render_configs(make_spec({"dtype": dtype}), ENGINE)
    for name in ("tensorrt_llm", "ensemble", "tensorrt_llm_bls"):
        inputs = _inputs(_parse(configs[name]))
        assert inputs["lora_weights"].data_type == expected, name
        assert list(inputs["lora_weights"].dims) == [-1, -1] and inputs["lora_weights"].optional
        assert inputs["lora_task_id"].data_type == DataType.TYPE_UINT64 and list(
            inputs["lora_task_id"].dims
        ) == [1]
        assert inputs["lora_config"].data_type == DataType.TYPE_INT32
        assert list(inputs["lora_config"].dims) == [-1, 3] and inputs["lora_config"].optional


def test_tensorrt_llm_model(make_spec: MakeSpec) -> None:
    spec = make_spec(
        {
            "serving": {
                "kvCacheFreeGpuMemFraction": 0.85,
                "batchSchedulerPolicy": "maxUtilization",
                "maxQueueSize": 17,
                "enableKvCacheReuse": False,
            },
            "lora": {"cache": {"hostMemoryBytes": "2Gi", "gpuMemoryFraction": 0.1}},
        }
    )
    config = _parse(render_configs(spec, ENGINE)["tensorrt_llm"])
    assert config.backend == "tensorrtllm"
    assert config.model_transaction_policy.decoupled
    assert config.dynamic_batching.default_queue_policy.max_queue_size == 17
    assert [(g.kind, g.count) for g in config.instance_group] == [
        (model_config_pb2.ModelInstanceGroup.KIND_CPU, 1)
    ]
    inputs = _inputs(config)
    assert inputs["input_ids"].data_type == DataType.TYPE_INT32 and inputs["input_ids"].allow_ragged_batch
    assert not inputs["input_lengths"].optional and not inputs["request_output_len"].optional
    for name, dtype in [
        ("end_id", DataType.TYPE_INT32),
        ("pad_id", DataType.TYPE_INT32),
        ("streaming", DataType.TYPE_BOOL),
        ("temperature", DataType.TYPE_FP32),
        ("runtime_top_k", DataType.TYPE_INT32),
        ("runtime_top_p", DataType.TYPE_FP32),
        ("seed", DataType.TYPE_UINT64),
        ("stop", DataType.TYPE_BOOL),
    ]:
        assert inputs[name].data_type == dtype and inputs[name].optional, name
    outputs = {tensor.name: tensor for tensor in config.output}
    assert list(outputs["output_ids"].dims) == [-1, -1] and list(outputs["sequence_length"].dims) == [-1]
    assert _params(config) == {
        "max_beam_width": "1",
        "FORCE_CPU_ONLY_INPUT_TENSORS": "no",
        "gpt_model_type": "inflight_fused_batching",
        "gpt_model_path": ENGINE,
        "batch_scheduler_policy": "max_utilization",
        "kv_cache_free_gpu_mem_fraction": "0.85",
        "enable_kv_cache_reuse": "false",
        "enable_chunked_context": "true",
        "exclude_input_in_output": "true",
        "tokenizer_dir": "/trtfleet/artifact/tokenizer",
        "xgrammar_tokenizer_info_path": "",
        "guided_decoding_backend": "",
        "lora_cache_optimal_adapter_size": "8",
        "lora_cache_max_adapter_size": "64",
        "lora_cache_gpu_memory_fraction": "0.1",
        "lora_cache_host_memory_bytes": str(2 * 2**30),
    }


def test_reference_uses_the_python_backend_with_the_same_interface(make_spec: MakeSpec) -> None:
    gpu = _parse(render_configs(make_spec(), ENGINE)["tensorrt_llm"])
    ref = _parse(render_configs(make_spec(), ENGINE, reference=True)["tensorrt_llm"])
    assert (gpu.backend, ref.backend) == ("tensorrtllm", "python")
    assert list(gpu.input) == list(ref.input) and list(gpu.output) == list(ref.output)
    # the reference engine's model directory holds its tokenizer (see render.py)
    assert _params(ref) == {
        **_params(gpu),
        "reference_model_dir": ENGINE,
        "tokenizer_dir": ENGINE,
        "reference_max_queue_size": "256",
    }
    by_runtime = render_configs(make_spec({"runtime": "reference"}), ENGINE)
    assert _parse(by_runtime["tensorrt_llm"]).backend == "python"
    assert _params(_parse(by_runtime["preprocessing"]))["tokenizer_dir"] == ENGINE


def test_reference_models_have_no_triton_batcher(make_spec: MakeSpec) -> None:
    """Triton's batcher can hold a request 500 ms on a one-instance model (render.py); the engine queues."""
    spec = make_spec({"serving": {"maxQueueSize": 17}})
    gpu = {name: _parse(text) for name, text in render_configs(spec, ENGINE).items()}
    ref = {name: _parse(text) for name, text in render_configs(spec, ENGINE, reference=True).items()}
    for name in ("tensorrt_llm", "preprocessing", "postprocessing"):
        assert gpu[name].HasField("dynamic_batching"), name
        assert not ref[name].HasField("dynamic_batching"), name
    assert _params(ref["tensorrt_llm"])["reference_max_queue_size"] == "17"
    assert "reference_max_queue_size" not in _params(gpu["tensorrt_llm"])


def test_lora_disabled_drops_lora_inputs_and_parameters(make_spec: MakeSpec) -> None:
    configs = render_configs(make_spec({"lora": {"enabled": False}}), ENGINE)
    for name in ("tensorrt_llm", "ensemble", "tensorrt_llm_bls"):
        text = configs[name]
        assert "lora_" not in text, name
    ensemble = _parse(configs["ensemble"])
    keys = {key for step in ensemble.ensemble_scheduling.step for key in step.input_map}
    assert "lora_task_id" not in keys and "input_ids" in keys


def test_ensemble_wiring(make_spec: MakeSpec) -> None:
    ensemble = _parse(render_configs(make_spec(), ENGINE)["ensemble"])
    assert ensemble.platform == "ensemble"
    steps = list(ensemble.ensemble_scheduling.step)
    assert [s.model_name for s in steps] == ["preprocessing", "tensorrt_llm", "postprocessing"]
    pre, llm, post = steps
    assert pre.input_map["QUERY"] == "text_input" and pre.input_map["REQUEST_OUTPUT_LEN"] == "max_tokens"
    assert llm.input_map["input_ids"] == pre.output_map["INPUT_ID"]
    assert llm.input_map["streaming"] == "stream" and llm.input_map["lora_task_id"] == "lora_task_id"
    assert post.input_map["TOKENS_BATCH"] == llm.output_map["output_ids"]
    assert post.output_map["OUTPUT"] == "text_output"
    inputs = _inputs(ensemble)
    assert inputs["text_input"].data_type == DataType.TYPE_STRING and list(inputs["text_input"].dims) == [1]
    assert inputs["max_tokens"].data_type == DataType.TYPE_INT32 and not inputs["max_tokens"].optional
    for name in (
        "stream",
        "temperature",
        "top_k",
        "top_p",
        "seed",
        "end_id",
        "pad_id",
        "stop_words",
        "bad_words",
    ):
        assert inputs[name].optional, name
    # every ensemble input is used by a step, every step output that is not internal is an ensemble output
    used = {value for step in steps for value in step.input_map.values()}
    produced = {value for step in steps for value in step.output_map.values()}
    assert set(inputs) - used == set()
    assert {o.name for o in ensemble.output} == {v for v in produced if not v.startswith("_")}


def test_bls_matches_the_ensemble_interface(make_spec: MakeSpec) -> None:
    configs = render_configs(make_spec(), ENGINE)
    bls, ensemble = _parse(configs["tensorrt_llm_bls"]), _parse(configs["ensemble"])
    assert bls.backend == "python" and bls.model_transaction_policy.decoupled
    assert _params(bls)["tensorrt_llm_model_name"] == "tensorrt_llm"
    shared = {
        "text_input",
        "max_tokens",
        "stream",
        "temperature",
        "top_k",
        "top_p",
        "seed",
        "end_id",
        "pad_id",
        "lora_task_id",
        "lora_weights",
        "lora_config",
        "stop_words",
        "bad_words",
    }
    bls_inputs, ens_inputs = _inputs(bls), _inputs(ensemble)
    for name in shared:
        assert bls_inputs[name].data_type == ens_inputs[name].data_type, name
    assert [o.name for o in bls.output] == [o.name for o in ensemble.output]


def test_rendering_is_deterministic_and_quotes_paths(make_spec: MakeSpec) -> None:
    odd = '/models/with "quote" and \\backslash'
    first = render_configs(make_spec(), odd, tokenizer_dir="/tok")
    assert first == render_configs(make_spec(), odd, tokenizer_dir="/tok")
    config = _parse(first["tensorrt_llm"])
    assert _params(config)["gpt_model_path"] == odd
    assert _params(_parse(first["postprocessing"]))["tokenizer_dir"] == "/tok"


def test_default_tokenizer_dir_is_beside_the_engine(make_spec: MakeSpec) -> None:
    config = _parse(render_configs(make_spec(), "/a/b/engine")["preprocessing"])
    assert _params(config)["tokenizer_dir"] == "/a/b/tokenizer"


def test_empty_engine_dir_is_refused(make_spec: MakeSpec) -> None:
    with pytest.raises(RenderError):
        render_configs(make_spec(), "")


def test_render_model_repository_writes_versions(make_spec: MakeSpec, tmp_path: Path) -> None:
    written = render_model_repository(make_spec(), ENGINE, tmp_path)
    assert [p.relative_to(tmp_path).as_posix() for p in written] == [
        f"{name}/config.pbtxt" for name in sorted(MODEL_NAMES)
    ]
    for name in MODEL_NAMES:
        assert (tmp_path / name / "1").is_dir()
        assert (tmp_path / name / "config.pbtxt").read_text() == render_configs(make_spec(), ENGINE)[name]
    assert not list(tmp_path.rglob("*.tmp"))
