"""Golden files of the engine tooling: build plan, capacity and the five Triton configs per case.

Each ``<case>/input.yaml`` is a BaseModel; ``<case>/expected/`` holds what trtfleet renders for it.
Regenerate on purpose with ``pytest tests/golden/engines --update-golden`` and review the diff like code.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.golden import check_golden_dir
import yaml
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2
from trtfleet_engines.capacity import plan_capacity
from trtfleet_engines.plan import StageStep, plan_engine_build
from trtfleet_engines.triton import render_configs

from trtfleet.api import BaseModel

pytestmark = pytest.mark.golden

HERE = Path(__file__).resolve().parent
CASES = sorted(p.name for p in HERE.iterdir() if (p / "input.yaml").is_file())


def render_case(case: str) -> dict[str, str]:
    """File name -> content of everything the case's expected/ directory holds."""
    spec = BaseModel.model_validate(yaml.safe_load((HERE / case / "input.yaml").read_text())).spec
    plan = plan_engine_build(spec)
    stage = plan.steps[-1]
    assert isinstance(stage, StageStep)
    files = {
        "plan.json": plan.to_json(),
        "capacity.json": json.dumps(plan_capacity(spec).to_json_dict(), indent=2, sort_keys=True) + "\n",
    }
    configs = render_configs(spec, stage.serve_engine_dir, tokenizer_dir=stage.serve_tokenizer_dir)
    files.update({f"{name}.config.pbtxt": text for name, text in configs.items()})
    return files


def test_cases_exist() -> None:
    assert {
        "llama-fp16-tp1-lora",
        "llama-bf16-tp2",
        "mistral-int4-awq",
        "llama70b-fp8-kv-fp8",
        "qwen2-lora-disabled",
        "reference-tiny",
    } <= set(CASES)


@pytest.mark.parametrize("case", CASES)
def test_golden(case: str, update_golden: bool) -> None:
    files = render_case(case)
    for name, text in files.items():
        if name.endswith(".pbtxt"):
            text_format.Parse(text, model_config_pb2.ModelConfig())
            assert "${" not in text, name
    check_golden_dir(HERE / case / "expected", files, update=update_golden, case=case)
