"""A merged adapter (Adapter ``mode: merged``): its name goes to its merged fleet, hot-swapped on the shared
pool behind it; the live choice follows readiness (``FleetSet.serving``), as a migration's does."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from trtfleet_router.chat import chat_renderer
from trtfleet_router.discovery.static import FleetConfig, snapshot_from_config
from trtfleet_router.liveview import FleetSet, PodEndpoint
from trtfleet_router.models_registry import (
    AdapterEntry,
    BaseModelEntry,
    EngineLimits,
    ModelRegistry,
    merged_entry,
    merged_fleet_name,
)
from trtfleet_router.routing.config import RoutingConfig

TINY = BaseModelEntry("tiny", "reference", EngineLimits(100, 150), chat_renderer("reference"))
UPPER = AdapterEntry("upper", "tiny", 1, "/adapters/upper")


@dataclass(frozen=True)
class Case:
    bases: list[BaseModelEntry]
    adapters: list[AdapterEntry] = field(default_factory=list)
    name: str = "upper"
    want_base: str = "upper@merged"
    want_adapter: str | None = None
    want_fallback: tuple[str, str | None] | None = ("tiny", "upper")  # (base, adapter) of the fallback


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(Case([TINY, merged_entry(TINY, "upper")], [UPPER]), id="merged-first-dynamic-behind"),
        pytest.param(Case([TINY, merged_entry(TINY, "upper")], want_fallback=None), id="merged-only"),
        pytest.param(Case([TINY], [UPPER], want_base="tiny", want_adapter="upper", want_fallback=None),
                     id="dynamic-only"),
        pytest.param(Case([TINY, merged_entry(TINY, "tiny")], name="tiny", want_base="tiny", want_fallback=None),
                     id="a-base-model-keeps-its-own-name"),
    ],
)
def test_a_merged_adapters_name_resolves_to_its_fleet(case: Case) -> None:
    target = ModelRegistry(case.bases, case.adapters).resolve(case.name)
    assert target.base.name == case.want_base
    assert (target.adapter.served_name if target.adapter else None) == case.want_adapter
    fallback = target.fallback
    assert ((fallback.base.name, fallback.adapter.served_name if fallback.adapter else None) if fallback
            else None) == case.want_fallback


def test_the_merged_fleet_is_no_served_name_and_its_pods_serve_the_adapters_name() -> None:
    registry = ModelRegistry([TINY, merged_entry(TINY, "upper")], [UPPER])
    assert registry.served_bases() == ["tiny"] and merged_fleet_name("upper") in registry.bases
    assert sorted(registry.served_names()) == ["tiny", "upper"]
    target = registry.resolve("upper")
    assert target.served_name == "upper" and target.base.upstream_name == "upper"
    assert target.base.merged_base == "tiny" and target.model_kind == "base"  # no LoRA inputs upstream


def _pods(*names: str, ready: bool = True) -> dict[str, PodEndpoint]:
    return {n: PodEndpoint(n, f"{n}:1", n, ready=ready) for n in names}


@pytest.mark.parametrize(
    ("merged_pods", "merged_ready", "shared_pods", "served_by"),
    [
        pytest.param(["m1"], True, ["s1"], "upper@merged", id="merged-ready"),
        pytest.param(["m1"], False, ["s1"], "tiny", id="merged-not-ready-hot-swapped"),
        pytest.param([], True, ["s1"], "tiny", id="merged-scaled-to-zero-hot-swapped"),
        pytest.param([], True, [], "upper@merged", id="nobody-ready-the-merged-fleet-answers"),
    ],
)
def test_requests_follow_the_merged_pods_readiness(
    merged_pods: list[str], merged_ready: bool, shared_pods: list[str], served_by: str
) -> None:
    config = FleetConfig.model_validate({"baseModels": [{
        "name": "tiny", "architecture": "reference",
        "backends": [{"address": f"{p}:1", "podId": p} for p in shared_pods],
        "adapters": [{"servedName": "upper", "taskId": 1, "artifact": "/adapters/upper"}],
        "mergedAdapters": [{"servedName": "upper", "backends": [{"address": f"{p}:1", "podId": p}
                                                               for p in merged_pods]}],
    }]})
    snapshot = snapshot_from_config(config)
    pods = {**snapshot.pods, "upper@merged": _pods(*merged_pods, ready=merged_ready)}
    fleets = FleetSet(RoutingConfig(), seed=1)
    fleets.apply(type(snapshot)(snapshot.registry, pods))
    assert set(fleets.fleets) == {"tiny", "upper@merged"}
    assert fleets.serving(fleets.registry.resolve("upper")).base.name == served_by
