"""``spec.serving.rollout`` and the serving pods' CPU and memory requests, as the builders render them."""

from __future__ import annotations

import pytest
from trtfleet_operator.builders.common import rollout_strategy, serving_resources

from tests.unit.operator.helpers import example
from trtfleet.api import BaseModelSpec


def spec(**serving: object) -> BaseModelSpec:
    doc = example("basemodel-llama3-8b-tensorrtllm.yaml")["spec"]
    doc["serving"] = {**doc["serving"], **serving}
    return BaseModelSpec.model_validate(doc)


@pytest.mark.parametrize(
    ("rollout", "expected"),
    [
        (None, {"maxSurge": 1, "maxUnavailable": 0}),
        ({"strategy": "Surge", "pods": 2}, {"maxSurge": 2, "maxUnavailable": 0}),
        ({"strategy": "Replace"}, {"maxSurge": 0, "maxUnavailable": 1}),
        ({"strategy": "Replace", "pods": 3}, {"maxSurge": 0, "maxUnavailable": 3}),
    ],
)
def test_rollout_strategy(rollout: dict[str, object] | None, expected: dict[str, int]) -> None:
    s = spec(**({"rollout": rollout} if rollout else {}))
    assert rollout_strategy(s) == {"type": "RollingUpdate", "rollingUpdate": expected}


def test_rollout_refuses_unknown_strategies_and_zero_pods() -> None:
    with pytest.raises(ValueError):
        spec(rollout={"strategy": "Recreate"})
    with pytest.raises(ValueError):
        spec(rollout={"pods": 0})


def test_serving_requests_cover_the_host_lora_tier_and_keep_the_specs_own() -> None:
    resources = serving_resources(spec())  # hostMemoryBytes 4Gi, one GPU
    assert resources["requests"] == {"cpu": "2", "memory": "20Gi", "nvidia.com/gpu": 1}
    bigger = serving_resources(spec(resources={"requests": {"memory": "64Gi"}, "limits": {"nvidia.com/gpu": 1}}))
    assert bigger["requests"]["memory"] == "64Gi" and bigger["requests"]["cpu"] == "2"
