"""A spec the pinned TensorRT-LLM release refuses fails as a status condition naming the rule and the fix, and
nothing is created (no build Job, no Service): issue 20."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from trtfleet_operator.config import OperatorConfig
from trtfleet_operator.planning import UNSUPPORTED_BY_RELEASE
from trtfleet_operator.reconcile.basemodel import BaseModelObserved, reconcile_basemodel

from tests.unit.operator.helpers import NOW, condition, llama
from trtfleet.api import BaseModelStatus


@dataclass(frozen=True)
class Case:
    spec: dict[str, Any]
    rule_id: str
    fix: str


CASES = [
    pytest.param(
        Case({"quantization": {"mode": "int8_weight_only"}, "engine": {"gpu": {"product": "B200"}},
              "serving": {"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-B200"}}},
             "sm100-no-int-weights", "on B200 use quantization.mode none or fp8"),
        id="b200-int8",
    ),
    pytest.param(
        # the example spec sets enableChunkedContext: true explicitly; an int8 KV cache has no paged context FMHA
        Case({"quantization": {"kvCacheDtype": "int8"}}, "chunked-context-needs-paged-context-fmha",
             "remove serving.enableChunkedContext"),
        id="int8-kv-chunked",
    ),
]


@pytest.mark.parametrize("case", CASES)
def test_refused_by_the_release_creates_nothing_and_says_why(case: Case) -> None:
    obj = llama(spec=case.spec)
    result = reconcile_basemodel(obj, BaseModelObserved(basemodels=(obj,)), OperatorConfig(), NOW)
    BaseModelStatus.model_validate(result.status)
    assert result.apply == ()
    assert result.status["phase"] == "Failed"
    built = condition(result.status, "EngineBuilt")
    assert (built["status"], built["reason"]) == ("False", UNSUPPORTED_BY_RELEASE)
    assert f"[{case.rule_id}]" in built["message"] and case.fix in built["message"]
    assert "TensorRT-LLM 1.2.1" in built["message"]
    assert condition(result.status, "Ready")["status"] == "False"


def test_both_conditions_speak_when_the_spec_neither_fits_nor_builds() -> None:
    obj = llama(spec={"quantization": {"mode": "int8_weight_only"}, "engine": {"gpu": {"product": "B200"}},
                      "serving": {"kvCacheFreeGpuMemFraction": 0.0001}})
    result = reconcile_basemodel(obj, BaseModelObserved(basemodels=(obj,)), OperatorConfig(), NOW)
    assert result.apply == ()
    assert condition(result.status, "CapacityPlanned")["reason"] == "DoesNotFit"
    assert condition(result.status, "EngineBuilt")["reason"] == UNSUPPORTED_BY_RELEASE
