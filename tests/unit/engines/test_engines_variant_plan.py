"""QLoRA base variants' build and prepare plans: the dequantize step, and a hash that covers the quantization."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from trtfleet_engines.errors import UnsupportedError
from trtfleet_engines.lora.qlora_base import VARIANT_RECORD
from trtfleet_engines.plan import CommandStep, StageStep, engine_hash, plan_engine_build, plan_variant_engine_build
from trtfleet_engines.pytorch.serving import plan_prepare, prepare_hash
from trtfleet_engines.reference.numpy_llama import TINY_LLAMA_DIR

from trtfleet.api.adapter import BaseQuantizationSpec
from trtfleet.api.basemodel import BaseModelSpec
from trtfleet.cli import main as cli_main

MakeSpec = Callable[..., BaseModelSpec]
NF4 = BaseQuantizationSpec.model_validate({"quantType": "nf4", "doubleQuant": True, "computeDtype": "bfloat16"})

# Every field of BaseQuantizationSpec enters the variant's hash (build and prepare alike).
VARIANT_CHANGES_HASH: list[tuple[str, dict[str, Any]]] = [
    ("quantType", {"quantType": "fp4"}),
    ("blockSize", {"blockSize": 128}),
    ("doubleQuant", {"doubleQuant": False}),
    ("computeDtype", {"computeDtype": "float16"}),
]


def _variant(patch: dict[str, Any]) -> BaseQuantizationSpec:
    return BaseQuantizationSpec.model_validate({**NF4.to_wire(), **patch})


def test_variant_hash_table_covers_every_field() -> None:
    assert {name for name, _ in VARIANT_CHANGES_HASH} == {
        info.alias or name for name, info in BaseQuantizationSpec.model_fields.items()
    }


@pytest.mark.parametrize(("name", "patch"), VARIANT_CHANGES_HASH, ids=[c[0] for c in VARIANT_CHANGES_HASH])
def test_variant_hash_changes(make_spec: MakeSpec, name: str, patch: dict[str, Any]) -> None:
    spec = make_spec()
    assert plan_variant_engine_build(spec, _variant(patch)).engine_hash != plan_variant_engine_build(
        spec, NF4
    ).engine_hash, name
    prepare = make_spec({"runtime": "pytorch"})
    assert prepare_hash(prepare, base_quantization=_variant(patch).variant_text()) != prepare_hash(
        prepare, base_quantization=NF4.variant_text()
    ), name


def test_variant_hash_covers_the_base_and_leaves_base_hashes_alone(make_spec: MakeSpec) -> None:
    spec = make_spec()
    variant = plan_variant_engine_build(spec, NF4)
    assert variant.engine_hash == plan_variant_engine_build(spec, _variant({})).engine_hash
    assert variant.engine_hash != engine_hash(spec) == plan_engine_build(spec).engine_hash
    other_base = make_spec({"source": {"revision": "def456"}})
    assert plan_variant_engine_build(other_base, NF4).engine_hash != variant.engine_hash
    assert prepare_hash(make_spec({"runtime": "pytorch"})) != prepare_hash(
        make_spec({"runtime": "pytorch"}), base_quantization=NF4.variant_text()
    )


def test_variant_build_dequantizes_then_converts_with_lora(make_spec: MakeSpec) -> None:
    plan = plan_variant_engine_build(make_spec(), NF4, workdir="/w")
    assert [s.name for s in plan.steps] == ["fetch", "dequantize-base", "convert-checkpoint", "trtllm-build", "stage"]
    steps = {s.name: s for s in plan.steps if isinstance(s, CommandStep)}
    assert steps["dequantize-base"].argv == (
        "trtfleet", "lora", "base-variant", "--base", "/w/source", "--quantization", "nf4:64:double:bfloat16",
        "--out", "/w/variant",
    )
    convert = steps["convert-checkpoint"].argv
    assert convert[convert.index("--model_dir") + 1] == "/w/variant"
    assert "--lora_plugin" in steps["trtllm-build"].argv  # adapters are hot-swapped on the variant
    stage = plan.steps[-1]
    assert isinstance(stage, StageStep) and stage.model_dir == "/w/source"  # the tokenizer is the base's


def test_reference_variant_stages_the_dequantized_model(make_spec: MakeSpec) -> None:
    cpu = {"engine": {"gpu": {"product": "cpu"}}}
    spec = make_spec({"source": {"uri": "file:///opt/m"}, "runtime": "reference", **cpu})
    plan = plan_variant_engine_build(spec, NF4, workdir="/w")
    assert [s.name for s in plan.steps] == ["fetch", "dequantize-base", "stage"]
    stage = plan.steps[-1]
    assert isinstance(stage, StageStep) and stage.model_dir == "/w/variant" and stage.copy_whole_model


def test_pytorch_prepare_writes_the_variant_and_serves_it(make_spec: MakeSpec) -> None:
    plan = plan_prepare(make_spec({"runtime": "pytorch"}), cache_root="/c", base_quantization="nf4:64:float32")
    assert plan.variant is not None and plan.variant.quantization == "nf4:64:float32"
    assert plan.serve_checkpoint_dir == plan.variant.output_dir == f"{plan.root_dir}/variant"
    assert plan.to_dict()["variant"] == {"quantization": "nf4:64:float32", "output_dir": f"{plan.root_dir}/variant"}
    assert "variant" not in plan_prepare(make_spec({"runtime": "pytorch"}), cache_root="/c").to_dict()


@pytest.mark.parametrize("runtime", ["tensorrtllm", "pytorch"])
def test_a_weight_quantized_base_is_refused(make_spec: MakeSpec, runtime: str) -> None:
    spec = make_spec({"runtime": runtime, "quantization": {"mode": "fp8"}})
    with pytest.raises(UnsupportedError, match="quantization.mode none"):
        if runtime == "pytorch":
            plan_prepare(spec, cache_root="/c", base_quantization="nf4:64:float32")
        else:
            plan_variant_engine_build(spec, NF4)


def test_the_dequantize_step_runs_with_our_cli(make_spec: MakeSpec, tmp_path: Path) -> None:
    plan = plan_variant_engine_build(make_spec(), NF4, workdir=str(tmp_path))
    (tmp_path / "source").symlink_to(TINY_LLAMA_DIR)
    argv = next(s.argv for s in plan.steps if isinstance(s, CommandStep) and s.name == "dequantize-base")
    assert argv[0] == "trtfleet" and cli_main(list(argv[1:])) == 0
    assert (tmp_path / "variant" / "model.safetensors").is_file() and (tmp_path / "variant" / VARIANT_RECORD).is_file()
    assert cli_main(list(argv[1:])) == 1  # the output exists: refused, nothing overwritten
