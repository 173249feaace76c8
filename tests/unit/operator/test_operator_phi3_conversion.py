"""In-cluster adapter conversion uses the base model's module mapping: Phi-3's fused ``gate_up_proj`` becomes
``mlp_h_to_4h`` (5), in an artifact of its own (issue 20, item 6)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from trtfleet_operator.builders.convert import artifact_dir, build_convert_job, conversion_id, module_mapping
from trtfleet_operator.config import OperatorConfig
from trtfleet_operator.jobs import convert as convert_job

from tests.unit.operator.helpers import llama
from trtfleet.api import BaseModelSpec, Source

FUSED = Path(__file__).resolve().parents[2] / "fixtures" / "lora" / "fused"


def _job_args(architecture: str) -> list[str]:
    base = BaseModelSpec.model_validate({**llama()["spec"], "architecture": architecture})
    job = build_convert_job(
        adapter="a", namespace="ns", owner={"uid": "u"}, source=Source(uri="s3://adapters/a"), source_key="k",
        basemodel="b", base=base, config=OperatorConfig(),
    )
    args: list[str] = job["spec"]["template"]["spec"]["containers"][0]["args"]
    return args


@pytest.mark.parametrize(("architecture", "mapping"), [("phi3", "phi3"), ("llama", None), ("qwen2", None)])
def test_the_module_mapping_is_part_of_the_conversion(architecture: str, mapping: str | None) -> None:
    base = BaseModelSpec.model_validate({**llama()["spec"], "architecture": architecture})
    assert module_mapping(base) == mapping
    args = _job_args(architecture)
    out = args[args.index("--out") + 1]
    if mapping:
        assert args[args.index("--architecture") + 1] == "phi3" and out.endswith("-float16-phi3")
        assert conversion_id("k", "float16", mapping) != conversion_id("k", "float16")
    else:
        assert "--architecture" not in args and out.endswith(f"/{artifact_dir('k', 'float16')}")


def test_the_entrypoint_converts_a_phi3_fused_adapter_to_mlp_h_to_4h(tmp_path: Path) -> None:
    out = tmp_path / "out"
    code = convert_job.main(
        [
            "--source-uri", f"file://{FUSED}",
            "--out", str(out),
            "--dtype", "float16",
            "--architecture", "phi3",
            "--termination-log", str(tmp_path / "log"),
            "--trtfleet", str(Path(sys.executable).parent / "trtfleet"),
        ]
    )
    assert code == 0, (tmp_path / "log").read_text()
    config = np.load(out / "model.lora_config.npy", allow_pickle=False)
    module_ids = set(config[0, :, 0].tolist())
    assert 5 in module_ids and 18 not in module_ids
    assert "mlp_h_to_4h" in json.loads((tmp_path / "log").read_text())["modules"]
