"""Build plans: exact argv per architecture and quantization, and merged-adapter builds (the engine hash:
test_engines_hash.py)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from trtfleet_engines.errors import PlanFileError, UnknownGpuError, UnsupportedError
from trtfleet_engines.plan import (
    BuildPlan,
    CommandStep,
    FetchStep,
    StageStep,
    engine_hash,
    plan_engine_build,
    plan_merged_engine_build,
)
from trtfleet_engines.reference.numpy_llama import SAMPLE_ADAPTERS_DIR, TINY_LLAMA_DIR

from trtfleet.api.basemodel import BaseModelSpec
from trtfleet.cli import main as cli_main

MakeSpec = Callable[..., BaseModelSpec]


def _command(plan: BuildPlan, name: str) -> tuple[str, ...]:
    steps = [s for s in plan.steps if isinstance(s, CommandStep) and s.name == name]
    assert len(steps) == 1, [s.name for s in plan.steps]
    return steps[0].argv


def _flag(argv: tuple[str, ...], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_default_llama_plan_steps_and_argv(make_spec: MakeSpec) -> None:
    plan = plan_engine_build(make_spec(), workdir="/w", trtllm_dir="/t")
    assert [s.name for s in plan.steps] == ["fetch", "convert-checkpoint", "trtllm-build", "stage"]
    fetch = plan.steps[0]
    assert isinstance(fetch, FetchStep) and fetch.download and fetch.local_dir == "/w/source"
    assert _command(plan, "convert-checkpoint") == (
        "python3",
        "/t/examples/models/core/llama/convert_checkpoint.py",
        "--model_dir",
        "/w/source",
        "--output_dir",
        "/w/checkpoint",
        "--dtype",
        "float16",
        "--tp_size",
        "1",
        "--pp_size",
        "1",
        "--workers",
        "1",
    )
    assert _command(plan, "trtllm-build") == (
        "trtllm-build",
        "--checkpoint_dir",
        "/w/checkpoint",
        "--output_dir",
        "/w/engine",
        "--max_batch_size",
        "64",
        "--max_input_len",
        "2048",
        "--max_seq_len",
        "4096",
        "--max_num_tokens",
        "8192",
        "--max_beam_width",
        "1",
        "--gpt_attention_plugin",
        "auto",
        "--gemm_plugin",
        "auto",
        "--remove_input_padding",
        "enable",
        "--kv_cache_type",
        "paged",
        "--use_paged_context_fmha",
        "enable",
        "--lora_plugin",
        "float16",
        "--lora_target_modules",
        "attn_q",
        "attn_k",
        "attn_v",
        "attn_dense",
        "mlp_h_to_4h",
        "mlp_4h_to_h",
        "mlp_gate",
        "--max_lora_rank",
        "64",
        "--workers",
        "1",
    )
    stage = plan.steps[-1]
    assert isinstance(stage, StageStep) and not stage.copy_whole_model
    assert (stage.serve_engine_dir, stage.serve_tokenizer_dir) == (
        "/trtfleet/artifact/engine",
        "/trtfleet/artifact/tokenizer",
    )


def test_no_deprecated_build_flags(make_spec: MakeSpec) -> None:
    argv = _command(plan_engine_build(make_spec()), "trtllm-build")
    for deprecated in ("--paged_kv_cache", "--max_output_len", "--use_custom_all_reduce", "--lora_dir"):
        assert deprecated not in argv


@pytest.mark.parametrize(
    ("patch", "step", "expected_in", "expected_not_in"),
    [
        (
            {"quantization": {"mode": "int8_weight_only"}},
            "convert-checkpoint",
            ["--use_weight_only", "--weight_only_precision", "int8"],
            ["--int8_kv_cache"],
        ),
        (
            {"quantization": {"mode": "int4_weight_only", "kvCacheDtype": "int8"}},
            "convert-checkpoint",
            ["--use_weight_only", "int4", "--int8_kv_cache"],
            ["--qformat"],
        ),
        ({"quantization": {"mode": "int4_awq"}}, "quantize", ["--qformat", "int4_awq"], ["--kv_cache_dtype"]),
        (
            {"quantization": {"mode": "fp8", "kvCacheDtype": "fp8"}},
            "quantize",
            ["--qformat", "fp8", "--kv_cache_dtype"],
            ["--use_weight_only"],
        ),
        (
            {"quantization": {"mode": "none", "kvCacheDtype": "fp8"}},
            "quantize",
            ["--qformat", "full_prec", "--kv_cache_dtype", "fp8"],
            [],
        ),
        (
            {"architecture": "phi3", "quantization": {"kvCacheDtype": "int8"}},
            "quantize",
            ["--qformat", "full_prec", "--kv_cache_dtype", "int8"],
            [],
        ),
    ],
)
def test_quantization_routes(
    make_spec: MakeSpec, patch: dict[str, Any], step: str, expected_in: list[str], expected_not_in: list[str]
) -> None:
    argv = _command(plan_engine_build(make_spec(patch), trtllm_dir="/t"), step)
    for item in expected_in:
        assert item in argv
    for item in expected_not_in:
        assert item not in argv
    if step == "quantize":
        assert argv[1] == "/t/examples/quantization/quantize.py"
        assert _flag(argv, "--tp_size") == "1" and _flag(argv, "--pp_size") == "1"


def test_fp8_disables_gemm_plugin_only_for_fp8(make_spec: MakeSpec) -> None:
    fp8 = _command(plan_engine_build(make_spec({"quantization": {"mode": "fp8"}})), "trtllm-build")
    awq = _command(plan_engine_build(make_spec({"quantization": {"mode": "int4_awq"}})), "trtllm-build")
    assert _flag(fp8, "--gemm_plugin") == "disable"
    assert _flag(awq, "--gemm_plugin") == "auto"


@pytest.mark.parametrize(
    ("architecture", "script"),
    [
        ("llama", "examples/models/core/llama/convert_checkpoint.py"),
        ("mistral", "examples/models/core/llama/convert_checkpoint.py"),
        ("mixtral", "examples/models/core/llama/convert_checkpoint.py"),
        ("qwen2", "examples/models/core/qwen/convert_checkpoint.py"),
        ("gemma", "examples/models/core/gemma/convert_checkpoint.py"),
        ("phi3", "examples/models/core/phi/convert_checkpoint.py"),
    ],
)
def test_converter_per_architecture(make_spec: MakeSpec, architecture: str, script: str) -> None:
    argv = _command(
        plan_engine_build(make_spec({"architecture": architecture}), trtllm_dir="/t"), "convert-checkpoint"
    )
    assert argv[1] == f"/t/{script}"
    if architecture == "gemma":  # its converter spells its flags differently and has no PP
        assert argv[2:4] == ("--ckpt-type", "hf") and "--model-dir" in argv and "--world-size" in argv
        assert "--tp_size" not in argv
    else:
        assert "--model_dir" in argv and "--tp_size" in argv and "--pp_size" in argv


def test_tensor_and_pipeline_parallel_sizes(make_spec: MakeSpec) -> None:
    spec = make_spec({"parallelism": {"tensor": 2, "pipeline": 2}, "engine": {"gpu": {"count": 4}}})
    plan = plan_engine_build(spec)
    convert = _command(plan, "convert-checkpoint")
    assert (_flag(convert, "--tp_size"), _flag(convert, "--pp_size"), _flag(convert, "--workers")) == (
        "2",
        "2",
        "4",
    )
    assert _flag(_command(plan, "trtllm-build"), "--workers") == "4"


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        (
            {"quantization": {"mode": "fp8"}, "engine": {"gpu": {"product": "A100-80GB"}}},
            "needs a GPU with fp8",
        ),
        (
            {"quantization": {"kvCacheDtype": "fp8"}, "engine": {"gpu": {"product": "A10G"}}},
            "kvCacheDtype fp8",
        ),
        (
            {"architecture": "gemma", "parallelism": {"pipeline": 2}, "engine": {"gpu": {"count": 2}}},
            "no pipeline parallelism",
        ),
        ({"engine": {"gpu": {"product": "cpu"}}}, "only for runtime reference"),
        ({"runtime": "reference", "quantization": {"mode": "int4_awq"}}, "runs the model in its dtype"),
    ],
)
def test_unsupported_combinations(make_spec: MakeSpec, patch: dict[str, Any], message: str) -> None:
    with pytest.raises(UnsupportedError, match=message):
        plan_engine_build(make_spec(patch))


def test_unknown_gpu_lists_known_products(make_spec: MakeSpec) -> None:
    with pytest.raises(UnknownGpuError, match="H100-80GB") as info:
        plan_engine_build(make_spec({"engine": {"gpu": {"product": "RTX-9090"}}}))
    assert "'RTX-9090'" in str(info.value) and "A10G" in str(info.value)


@pytest.mark.parametrize(
    ("uri", "scheme", "local_dir", "download"),
    [
        ("hf://org/model", "hf", "/w/source", True),
        ("s3://bucket/models/m", "s3", "/w/source", True),
        ("pvc://models-claim/llama/8b", "pvc", "/mnt/trtfleet/pvc/models-claim/llama/8b", False),
        ("file:///opt/models/m", "file", "/opt/models/m", False),
    ],
)
def test_fetch_step_per_scheme(
    make_spec: MakeSpec, uri: str, scheme: str, local_dir: str, download: bool
) -> None:
    plan = plan_engine_build(make_spec({"source": {"uri": uri}}), workdir="/w")
    fetch = plan.steps[0]
    assert isinstance(fetch, FetchStep)
    assert (fetch.scheme, fetch.local_dir, fetch.download) == (scheme, local_dir, download)
    assert _flag(_command(plan, "convert-checkpoint"), "--model_dir") == local_dir


def test_reference_plan_copies_the_model(make_spec: MakeSpec) -> None:
    spec = make_spec(
        {
            "source": {"uri": "file:///opt/trtfleet/models/tiny-llama"},
            "runtime": "reference",
            "engine": {"gpu": {"product": "cpu"}},
        }
    )
    plan = plan_engine_build(spec, workdir="/w")
    assert [s.kind for s in plan.steps] == ["fetch", "stage"]
    stage = plan.steps[1]
    assert isinstance(stage, StageStep) and stage.copy_whole_model
    assert stage.serve_tokenizer_dir == stage.serve_engine_dir == "/trtfleet/artifact/engine"
    assert plan.gpu_sm == "cpu"


def test_plan_json_round_trip_and_determinism(make_spec: MakeSpec) -> None:
    plan = plan_engine_build(make_spec({"quantization": {"mode": "int4_awq"}}))
    text = plan.to_json()
    assert text == plan_engine_build(make_spec({"quantization": {"mode": "int4_awq"}})).to_json()
    again = BuildPlan.from_json_dict(json.loads(text))
    assert again == plan and again.to_json() == text
    assert again.render_spec == make_spec({"quantization": {"mode": "int4_awq"}})


def test_plan_file_of_another_format_is_refused(make_spec: MakeSpec) -> None:
    data = plan_engine_build(make_spec()).to_json_dict()
    with pytest.raises(PlanFileError, match="formatVersion"):
        BuildPlan.from_json_dict({**data, "formatVersion": 99})
    with pytest.raises(PlanFileError, match="not a trtfleet build plan"):
        BuildPlan.from_json_dict({"formatVersion": 1, "steps": []})


def test_merged_adapter_build(make_spec: MakeSpec) -> None:
    spec = make_spec()
    plan = plan_merged_engine_build(spec, "hf://org/sql-adapter", "r1", workdir="/w")
    assert [s.name for s in plan.steps] == [
        "fetch",
        "fetch-adapter",
        "merge-lora",
        "convert-checkpoint",
        "trtllm-build",
        "stage",
    ]
    assert _command(plan, "merge-lora") == (
        "trtfleet",
        "lora",
        "merge",
        "--base",
        "/w/source",
        "--adapter",
        "/w/adapter",
        "--dtype",
        "float16",
        "--out",
        "/w/merged",
    )
    assert _flag(_command(plan, "convert-checkpoint"), "--model_dir") == "/w/merged"
    assert "--lora_plugin" not in _command(plan, "trtllm-build")
    assert plan.render_spec.lora.enabled is False
    base = engine_hash(spec)
    assert plan.engine_hash != base
    assert plan.engine_hash != plan_merged_engine_build(spec, "hf://org/sql-adapter", "r2").engine_hash
    assert plan.engine_hash != plan_merged_engine_build(spec, "hf://org/other-adapter", "r1").engine_hash
    assert plan.engine_hash == plan_merged_engine_build(spec, "hf://org/sql-adapter", "r1").engine_hash


def test_merged_build_merge_step_runs_with_our_cli(make_spec: MakeSpec, tmp_path: Path) -> None:
    # The plan's merge-lora argv is exactly what `trtfleet lora merge` accepts: run it on the tiny model.
    plan = plan_merged_engine_build(make_spec(), "hf://org/upper", "r1", workdir=str(tmp_path))
    argv = _command(plan, "merge-lora")
    (tmp_path / "source").symlink_to(TINY_LLAMA_DIR)
    (tmp_path / "adapter").symlink_to(Path(SAMPLE_ADAPTERS_DIR) / "upper")
    assert argv[0] == "trtfleet" and cli_main(list(argv[1:])) == 0
    assert (tmp_path / "merged" / "model.safetensors").is_file() and (tmp_path / "merged" / "merge.json").is_file()


def test_reference_merged_plan_merges_in_the_base_dtype_then_stages_the_merged_model(make_spec: MakeSpec) -> None:
    spec = make_spec(
        {
            "source": {"uri": "file:///opt/trtfleet/models/tiny-llama"},
            "runtime": "reference",
            "engine": {"gpu": {"product": "cpu"}},
        }
    )
    plan = plan_merged_engine_build(spec, "file:///opt/trtfleet/adapters/upper", None, workdir="/w")
    assert [s.name for s in plan.steps] == ["fetch", "fetch-adapter", "merge-lora", "stage"]
    assert _flag(_command(plan, "merge-lora"), "--dtype") == "base"
    assert _flag(_command(plan, "merge-lora"), "--adapter") == "/opt/trtfleet/adapters/upper"
    stage = plan.steps[-1]
    assert isinstance(stage, StageStep) and stage.model_dir == "/w/merged" and stage.copy_whole_model
    assert plan.render_spec.lora.enabled is False
    assert plan.engine_hash != plan_engine_build(spec).engine_hash
