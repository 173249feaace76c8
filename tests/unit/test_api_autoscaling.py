"""spec.autoscaling: the Python rules that mirror the CRD's CEL rules, and the scale subresource."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from trtfleet.api import BaseModelSpec
from trtfleet.api.crdgen import build_crds

SPEC = {"source": {"uri": "hf://org/model"}, "architecture": "llama"}


@pytest.mark.parametrize(
    ("autoscaling", "replicas", "message"),
    [
        pytest.param({"minReplicas": 3, "maxReplicas": 2}, 2, "minReplicas must not exceed", id="min-above-max"),
        pytest.param({"maxReplicas": 0}, 0, "greater than or equal to 1", id="max-zero"),
        pytest.param({"maxReplicas": 4, "targetRequestsPerPod": 0}, 1, "greater than 0", id="target-zero"),
        pytest.param({"maxReplicas": 4, "targetKvCacheFraction": 1.5}, 1, "less than or equal to 1", id="kv-above-1"),
        pytest.param({"minReplicas": 2, "maxReplicas": 4}, 1, "operator's to set", id="replicas-below-min"),
        pytest.param({"minReplicas": 0, "maxReplicas": 4}, 5, "operator's to set", id="replicas-above-max"),
        pytest.param({"maxReplicas": 4, "scaleDownStabilizationSeconds": -1}, 1, "greater than or equal to 0",
                     id="negative-window"),
    ],
)
def test_autoscaling_rules(autoscaling: dict[str, object], replicas: int, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        BaseModelSpec.model_validate({**SPEC, "serving": {"replicas": replicas}, "autoscaling": autoscaling})


def test_autoscaling_defaults_allow_zero() -> None:
    spec = BaseModelSpec.model_validate(
        {**SPEC, "serving": {"replicas": 0}, "autoscaling": {"minReplicas": 0, "maxReplicas": 8}}
    )
    assert spec.autoscaling is not None
    assert (spec.autoscaling.scale_down_stabilization_seconds, spec.autoscaling.scale_up_stabilization_seconds) == (
        300,
        0,
    )
    assert spec.autoscaling.adapter_working_set


def test_basemodel_crd_has_a_scale_subresource() -> None:
    version = build_crds()["trtfleet.io_basemodels.yaml"]["spec"]["versions"][0]
    assert version["subresources"]["scale"] == {
        "specReplicasPath": ".spec.serving.replicas",
        "statusReplicasPath": ".status.readyReplicas",
        "labelSelectorPath": ".status.selector",
    }
    rules = [r["rule"] for r in version["schema"]["openAPIV3Schema"]["properties"]["spec"]["x-kubernetes-validations"]]
    assert any("self.autoscaling.maxReplicas" in rule for rule in rules)
