"""``spec.runtime``: the values one runtime cannot serve are refused in Python with the CRD's CEL message,
and the CEL rules are the ones in the generated CRD."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError
from trtfleet_engines.pytorch.capacity import plan_pytorch_capacity

from trtfleet.api import BaseModel, BaseModelSpec
from trtfleet.api.basemodel import RUNTIME_RULES
from trtfleet.api.crdgen import structural_schema

ROOT = Path(__file__).resolve().parents[2]
BASE: dict[str, Any] = {"source": {"uri": "hf://org/model"}, "architecture": "llama"}


@dataclass(frozen=True)
class Refused:
    runtime: str
    quantization: dict[str, str]
    message: str


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(Refused("pytorch", {"kvCacheDtype": "int8"}, "kvCacheDtype int8 is for runtime tensorrtllm"),
                     id="int8-kv"),
        pytest.param(Refused("pytorch", {"mode": "int4_weight_only"}, "int4_weight_only is for runtime tensorrtllm"),
                     id="int4-weight-only"),
    ],
)
def test_values_the_runtime_cannot_serve_are_refused(case: Refused) -> None:
    with pytest.raises(ValidationError, match=case.message):
        BaseModelSpec.model_validate({**BASE, "runtime": case.runtime, "quantization": case.quantization})


@pytest.mark.parametrize(
    ("runtime", "quantization"),
    [
        pytest.param("pytorch", {"mode": "fp8", "kvCacheDtype": "fp8"}, id="pytorch-fp8"),
        pytest.param("pytorch", {"mode": "int4_awq"}, id="pytorch-int4-awq"),
        pytest.param("tensorrtllm", {"kvCacheDtype": "int8"}, id="engine-flow-int8-kv"),
        pytest.param("tensorrtllm", {"mode": "int4_weight_only"}, id="engine-flow-int4-weight-only"),
    ],
)
def test_values_the_runtime_serves_are_accepted(runtime: str, quantization: dict[str, str]) -> None:
    spec = BaseModelSpec.model_validate({**BASE, "runtime": runtime, "quantization": quantization})
    assert spec.runtime.value == runtime


@pytest.mark.parametrize("runtime", ["tensorrtllm", "reference"])
def test_the_triton_llmapi_server_is_refused_outside_pytorch(runtime: str) -> None:
    with pytest.raises(ValidationError, match=f"serving.server triton is for runtime pytorch only.*runtime {runtime}"):
        BaseModelSpec.model_validate({**BASE, "runtime": runtime, "serving": {"server": "triton"}})


@pytest.mark.parametrize("runtime", ["tensorrtllm", "reference"])
def test_priority_ordering_in_the_engine_is_refused_outside_pytorch(runtime: str) -> None:
    with pytest.raises(ValidationError, match=f"waitingQueuePolicy priority is for runtime pytorch only.*{runtime}"):
        BaseModelSpec.model_validate({**BASE, "runtime": runtime, "serving": {"waitingQueuePolicy": "priority"}})
    fcfs = BaseModelSpec.model_validate({**BASE, "runtime": runtime, "serving": {"waitingQueuePolicy": "fcfs"}})
    assert fcfs.serving.waiting_queue_policy is not None


def test_a_pytorch_base_model_may_order_its_engine_queue_by_priority() -> None:
    spec = BaseModelSpec.model_validate({**BASE, "runtime": "pytorch", "serving": {"waitingQueuePolicy": "priority"}})
    assert spec.serving.waiting_queue_policy is not None and spec.serving.waiting_queue_policy.value == "priority"
    assert BaseModelSpec.model_validate({**BASE, "runtime": "pytorch"}).serving.waiting_queue_policy is None


@pytest.mark.parametrize(("server", "expected"), [(None, "trtllm-serve"), ("trtllm-serve", "trtllm-serve"),
                                                  ("triton", "triton")])
def test_a_pytorch_base_model_picks_its_server(server: str | None, expected: str) -> None:
    serving = {} if server is None else {"server": server}
    spec = BaseModelSpec.model_validate({**BASE, "runtime": "pytorch", "serving": serving})
    assert spec.serving.server_or_default.value == expected


def test_every_runtime_rule_is_a_cel_rule_of_the_crd() -> None:
    rules = structural_schema(BaseModelSpec)["x-kubernetes-validations"]
    for rule in RUNTIME_RULES:
        assert rule.to_cel() in rules
        assert rule.to_cel()["rule"].startswith(f"!(self.runtime == '{rule.runtime.value}'")


def test_default_runtime_is_the_pytorch_backend() -> None:
    assert BaseModelSpec.model_validate(BASE).runtime.value == "pytorch"


def test_the_pytorch_example_is_valid_and_fits() -> None:
    doc = yaml.safe_load((ROOT / "examples" / "basemodel-llama3-8b-pytorch.yaml").read_text())
    base = BaseModel.model_validate(doc)
    assert base.spec.runtime.value == "pytorch"
    assert plan_pytorch_capacity(base.spec).verdict == "ok"
