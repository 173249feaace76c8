"""The prepare Job of a QLoRA base variant on a ``runtime: pytorch`` base model, on real files: the staged
checkpoint's linear weights are replaced by bitsandbytes' 4-bit round trip once, then served from there."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from trtfleet_engines.lora.bnb4bit import quantize_dequantize, round_to
from trtfleet_engines.lora.merge import read_safetensors_raw, to_float32
from trtfleet_engines.lora.qlora_base import VARIANT_RECORD
from trtfleet_engines.pytorch.serving import plan_prepare
from trtfleet_engines.reference.numpy_llama import TINY_LLAMA_DIR

from tests.unit.operator.jobs.test_prepare import prepare
from trtfleet.api import BaseModelSpec

SPEC = BaseModelSpec.model_validate(
    {"source": {"uri": f"file://{TINY_LLAMA_DIR}"}, "architecture": "llama", "runtime": "pytorch"}
)
WEIGHT = "model.layers.0.self_attn.q_proj.weight"


def write_plan(tmp_path: Path, quantization: str) -> Path:
    plan = plan_prepare(SPEC, cache_root=str(tmp_path / "cache"), base_quantization=quantization)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan.to_dict()))
    return path


def test_the_variant_is_written_once_and_served(tmp_path: Path) -> None:
    plan = write_plan(tmp_path, "fp4:128:float16")
    code, report = prepare(tmp_path, plan)
    assert code == 0, report
    result = json.loads(report)
    served = Path(result["serveDir"])
    assert served.name == "variant" and result["variant"] is True
    assert json.loads((served / VARIANT_RECORD).read_text())["baseQuantization"]["quant_type"] == "fp4"
    original, _ = read_safetensors_raw(Path(TINY_LLAMA_DIR) / "model.safetensors")
    variant, _ = read_safetensors_raw(served / "model.safetensors")
    source = to_float32(WEIGHT, original[WEIGHT])
    want = round_to(quantize_dequantize(source, "float32", 128, "fp4", double_quant=False), "float16")
    assert np.array_equal(to_float32(WEIGHT, variant[WEIGHT]), want)
    assert not any(p.name.endswith(".partial") for p in served.parent.iterdir())
    code, report = prepare(tmp_path, plan)
    assert (code, json.loads(report)["variant"], json.loads(report)["staged"]) == (0, False, False)


def test_an_unparsable_quantization_is_a_spec_error(tmp_path: Path) -> None:
    code, report = prepare(tmp_path, write_plan(tmp_path, "int3"))
    assert code == 2 and "base variant" in report and "nf4 or fp4" in report
