"""Serving objects: what a reference pod reads does not change with the fleet's size."""

from __future__ import annotations

from typing import Any

from trtfleet_operator.builders.serving import SPEC_KEY, build_model_repo_configmap
from trtfleet_operator.config import OperatorConfig

from trtfleet.api import BaseModelSpec


def test_sizing_the_fleet_does_not_change_what_a_reference_pod_serves() -> None:
    """basemodel.json leaves out serving.replicas and autoscaling, so a decision never rolls the pods."""
    repos = []
    for replicas, scaling in ((2, None), (5, None), (3, {"minReplicas": 1, "maxReplicas": 4})):
        body: dict[str, Any] = {"source": {"uri": "file:///m"}, "architecture": "llama", "runtime": "reference",
                                "serving": {"replicas": replicas}}
        if scaling is not None:
            body["autoscaling"] = scaling
        repo = build_model_repo_configmap(BaseModelSpec.model_validate(body), name="tiny", namespace="ns",
                                          owner={}, engine_hash="h", config=OperatorConfig())
        repos.append(repo["data"])
    assert repos[0] == repos[1] == repos[2]
    assert "replicas" not in repos[0][SPEC_KEY] and "autoscaling" not in repos[0][SPEC_KEY]
