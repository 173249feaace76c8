"""``trtfleet engines plan|hash|capacity`` follow ``spec.runtime``: a ``pytorch`` spec gets the PyTorch planners.

Expected values come from the planners themselves (the operator's calls), so the CLI is checked for routing and
presentation; the planners' numbers have their own tests beside this file.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from trtfleet_engines.gpus import lookup_gpu
from trtfleet_engines.plan import engine_hash
from trtfleet_engines.pytorch.capacity import plan_pytorch_capacity
from trtfleet_engines.pytorch.options import build_llm_api_options
from trtfleet_engines.pytorch.serving import prepare_hash

from trtfleet.api import BaseModel
from trtfleet.cli import main

ROOT = Path(__file__).resolve().parents[4]
TORCH = ROOT / "examples" / "basemodel-llama3-8b-pytorch.yaml"
ENGINE = ROOT / "examples" / "basemodel-llama3-8b-tensorrtllm.yaml"


def _model(path: Path) -> BaseModel:
    return BaseModel.model_validate(yaml.safe_load(path.read_text()))


def test_plan_prints_prepare_plan_and_options(capsys: pytest.CaptureFixture[str]) -> None:
    spec = _model(TORCH).spec
    assert main(["engines", "plan", "-f", str(TORCH), "--cache-root", "/cache"]) == 0
    plan = json.loads(capsys.readouterr().out)
    digest = prepare_hash(spec)
    assert plan["runtime"] == "pytorch" and plan["prepareHash"] == digest
    assert plan["prepare"]["stage"]["destination_dir"] == f"/cache/checkpoints/{digest}/original"
    assert plan["prepare"]["quantize"] is None
    assert plan["serveCheckpointDir"] == f"/cache/checkpoints/{digest}/original"
    assert plan["llmApiOptions"] == build_llm_api_options(spec)
    assert "steps" not in plan and "llmapiModelYaml" not in plan


def test_plan_of_a_triton_served_spec_prints_the_llmapi_model_yaml(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    doc = yaml.safe_load(TORCH.read_text())
    doc["spec"].setdefault("serving", {})["server"] = "triton"
    path = tmp_path / "triton.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert main(["engines", "plan", "-f", str(path), "--cache-root", "/cache"]) == 0
    plan = json.loads(capsys.readouterr().out)
    model_yaml = plan["llmapiModelYaml"]
    assert model_yaml["model"] == plan["serveCheckpointDir"]
    assert model_yaml["triton_config"] == {"max_batch_size": 0, "decoupled": True}


def test_plan_refuses_a_merged_adapter(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["engines", "plan", "-f", str(TORCH), "--merged-adapter", "hf://org/a"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --merged-adapter") and "runtime pytorch" in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("path", "expected"),
    [(TORCH, lambda m: prepare_hash(m.spec)), (ENGINE, lambda m: engine_hash(m.spec))],
    ids=["pytorch", "tensorrtllm"],
)
def test_hash_follows_the_runtime(
    capsys: pytest.CaptureFixture[str], path: Path, expected: Callable[[BaseModel], str]
) -> None:
    assert main(["engines", "hash", "-f", str(path)]) == 0
    assert capsys.readouterr().out.strip() == expected(_model(path))


def test_capacity_table_names_the_lora_tiers(capsys: pytest.CaptureFixture[str]) -> None:
    plan = plan_pytorch_capacity(_model(TORCH).spec)
    assert plan.lora is not None
    assert main(["engines", "capacity", "-f", str(TORCH)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("BaseModel llama3-8b on H100-80GB (") and "runtime pytorch" in lines[0]
    rows = {line[2:19].strip(): line for line in lines[1:-1]}
    assert list(rows) == ["GPU memory", "weights per GPU", "runtime reserve", "free after both", "KV cache",
                          "LoRA page", "LoRA host tier", "LoRA device tier"]
    host, device = plan.lora.host, plan.lora.device
    assert f"max_cpu_loras {host.adapters}: {host.pages} pages" in rows["LoRA host tier"]
    assert f"max_loras {device.adapters}: {device.pages} pages" in rows["LoRA device tier"]
    assert f"{plan.kv_cache_tokens:,} tokens" in rows["KV cache"]
    assert lines[-1] == "verdict: ok"


def test_capacity_json_is_the_pytorch_plan(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["engines", "capacity", "-f", str(TORCH), "--json", "--gpu", "H200-141GB"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data == plan_pytorch_capacity(_model(TORCH).spec, lookup_gpu("H200-141GB")).to_json_dict()
    assert data["gpu"] == "H200" and data["lora"]["maxLoras"] >= 1


def test_capacity_problem_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = yaml.safe_load(TORCH.read_text())
    doc["spec"]["source"]["uri"] = "hf://meta-llama/Llama-3.3-70B-Instruct"
    path = tmp_path / "bm.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert main(["engines", "capacity", "-f", str(path)]) == 1
    captured = capsys.readouterr()
    assert captured.out.splitlines()[-1] == "verdict: error"
    assert captured.err.startswith("error: weights need") and "Traceback" not in captured.err
