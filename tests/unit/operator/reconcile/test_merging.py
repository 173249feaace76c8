"""Merge advice on a BaseModel's Adapters (pure): the rate read from the routers' demand views, the
condition and status written, and ``mode: auto``'s switches within the cap and the dwell time; the Adapter
reconciler keeps the condition and serves ``mode: auto`` as ``status.merge.mode`` says."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest
from trtfleet_operator.config import OperatorConfig
from trtfleet_operator.reconcile.adapter import reconcile_adapter
from trtfleet_operator.reconcile.merging import adapter_rate, advise_basemodel, status_patch
from trtfleet_operator.reconcile.types import AdapterObserved

from tests.unit.operator.helpers import NOW, Obj, example, stored

MERGING = {"podRequestsPerSecond": 10.0, "sustainSeconds": 0, "minDwellSeconds": 600, "maxMergedAdapters": 1}


def basemodel(merging: Obj | None = MERGING) -> Obj:
    doc = example("basemodel-reference-tiny.yaml")
    if merging is not None:
        doc["spec"]["merging"] = merging
    return stored(doc, name="tiny")


def adapter(name: str, mode: str = "dynamic", merge: Obj | None = None) -> Obj:
    doc = {"apiVersion": "trtfleet.io/v1alpha1", "kind": "Adapter", "metadata": {"name": name},
           "spec": {"baseModel": "tiny", "mode": mode, "source": {"uri": f"file:///adapters/{name}"}}}
    status: Obj = {"servedName": name}
    if merge is not None:
        status["merge"] = merge
    return stored(doc, status=status)


def view(**rates: float) -> dict[str, Any]:
    """A router's /fleet/v1/demand: shared-pool rates, and ``<name>_merged`` for a merged fleet's."""
    shared = {k: v for k, v in rates.items() if not k.endswith("_merged")}
    bases: dict[str, Any] = {"tiny": {"adapter_requests_per_s": shared, "base_requests_per_s": 0.0}}
    for key, rate in rates.items():
        if key.endswith("_merged"):
            bases[key.removesuffix("_merged") + "@merged"] = {"adapter_requests_per_s": {}, "base_requests_per_s": rate}
    return {"replica": "r0", "window_s": 60, "base_models": bases}


@pytest.mark.parametrize(
    ("views", "want"),
    [
        pytest.param([], None, id="no-router"),
        pytest.param([view(a=2.0)], 2.0, id="shared-pool"),
        pytest.param([view(a=0.5, a_merged=3.0)], 3.5, id="merged-fleet-plus-fallback"),
        pytest.param([view(a=2.0), view(a=3.0)], 3.0, id="largest-over-peered-replicas"),
        pytest.param([view(b=2.0)], 0.0, id="silent-adapter"),
    ],
)
def test_adapter_rate(views: list[dict[str, Any]], want: float | None) -> None:
    assert adapter_rate(views, "tiny", "a") == want


@dataclass
class Case:
    adapters: list[Obj]
    views: list[dict[str, Any]]
    suggested: dict[str, str]
    modes: dict[str, str | None] = field(default_factory=dict)
    switched: set[str] = field(default_factory=set)
    merging: Obj | None = field(default_factory=lambda: dict(MERGING))


LONG_AGO = "2026-11-21T10:00:00Z"
JUST_NOW = "2026-11-21T11:59:00Z"

CASES = [
    pytest.param(Case([adapter("a"), adapter("b")], [view(a=8.0, b=1.0)], {"a": "Merged", "b": "Dynamic"},
                      {"a": None, "b": None}), id="advice-only-for-manual-adapters"),
    pytest.param(Case([adapter("a", "auto"), adapter("b", "auto")], [view(a=6.0, b=8.0)],
                      {"a": "Merged", "b": "Merged"}, {"a": "dynamic", "b": "merged"}, {"b"}),
                 id="auto-merges-the-busiest-within-the-cap"),
    pytest.param(Case([adapter("a", "auto"), adapter("m", "merged")], [view(a=8.0, m_merged=9.0)],
                      {"a": "Merged", "m": "Merged"}, {"a": "dynamic"}), id="explicit-merged-counts-against-the-cap"),
    pytest.param(Case([adapter("a", "auto", {"mode": "merged", "decided": "Merged", "switchedAt": LONG_AGO}),
                       adapter("b", "auto")], [view(a=0.5, a_merged=0.5, b=8.0)],
                      {"a": "Dynamic", "b": "Merged"}, {"a": "dynamic", "b": "merged"}, {"a", "b"}),
                 id="a-freed-slot-is-taken-in-the-same-round"),
    pytest.param(Case([adapter("a", "auto", {"mode": "merged", "decided": "Merged", "switchedAt": JUST_NOW})],
                      [view(a_merged=0.5)], {"a": "Dynamic"}, {"a": "merged"}), id="dwell-time-holds-a-switch"),
    pytest.param(Case([adapter("a", "auto", {"mode": "merged", "decided": "Merged"})], [], {"a": "Unknown"},
                      {"a": "merged"}), id="no-router-switches-nothing"),
    pytest.param(Case([adapter("a", "auto")], [view(a=8.0)], {"a": "Unknown"}, {"a": "dynamic"},
                      merging=None), id="no-capacity-no-advice"),
]


@pytest.mark.parametrize("case", CASES)
def test_advise_basemodel(case: Case) -> None:
    advices = {a.name: a for a in advise_basemodel(basemodel(case.merging), case.adapters, case.views, NOW)}
    assert {n: a.status["merge"]["suggested"] for n, a in advices.items()} == case.suggested
    assert {n: advices[n].status["merge"].get("mode") for n in case.modes} == case.modes
    assert {n for n, a in advices.items() if a.switched} == case.switched
    for name, advice in advices.items():
        condition = next(c for c in advice.status["conditions"] if c["type"] == "MergeRecommended")
        want = {"Merged": "True", "Dynamic": "False", "Unknown": "Unknown"}[case.suggested[name]]
        assert condition["status"] == want and condition["message"], condition
        if name in case.switched:
            assert advice.status["merge"]["switchedAt"] == "2026-11-21T12:00:00Z"
            assert any(e.reason.startswith("SwitchedTo") for e in advice.events)


def test_the_reason_carries_the_numbers() -> None:
    (advice,) = advise_basemodel(basemodel(), [adapter("a")], [view(a=4.1)], NOW)
    message = next(c for c in advice.status["conditions"] if c["type"] == "MergeRecommended")["message"]
    assert "41% of a pod" in message and "0.44 pod" in message, message
    assert advice.status["merge"]["podFraction"] == pytest.approx(0.41)


def test_the_memory_survives_a_round_trip_through_status() -> None:
    """What one round writes is what the next reads (restart-safe): the smoothed rate carries over."""
    merging = {**MERGING, "sustainSeconds": 240}
    first = advise_basemodel(basemodel(merging), [adapter("a")], [view(a=8.0)], NOW)[0]
    later = adapter("a", merge=first.status["merge"])
    second = advise_basemodel(basemodel(merging), [later], [view(a=0.0)], NOW + timedelta(seconds=60))[0]
    assert second.status["merge"]["requestsPerSecond"] == pytest.approx(4.0)  # one half-life (240 s / 4)
    assert second.status["merge"]["observingSince"] == first.status["merge"]["observingSince"]


def _observed(base: Obj) -> AdapterObserved:
    return AdapterObserved(basemodel=base, convert_jobs=(), convert_pods=(), deployment=None, basemodels=(base,),
                           merged_adapters=(), build_jobs=(), build_pods=(), plan_configmaps=(), engine_records=())


@pytest.mark.parametrize(("chosen", "served_merged"), [(None, False), ("dynamic", False), ("merged", True)])
def test_the_reconciler_serves_auto_as_chosen_and_keeps_the_condition(chosen: str | None, served_merged: bool) -> None:
    base = basemodel()
    merge = {"mode": chosen} if chosen else None
    obj = adapter("a", "auto", merge)
    kept = {"type": "MergeRecommended", "status": "True", "reason": "MergePays", "message": "m",
            "lastTransitionTime": LONG_AGO}
    obj["status"]["conditions"] = [kept]
    result = reconcile_adapter(obj, _observed(base), OperatorConfig(), NOW)
    deployments = [o for o in result.apply if o["kind"] == "Deployment"]
    assert bool(deployments) == served_merged
    assert kept in result.status["conditions"]
    assert "merge" not in result.status  # the timer's alone


@pytest.mark.parametrize(
    ("rate", "later_s", "written"),
    [
        pytest.param(8.0, 60, False, id="same-share-no-write"),
        pytest.param(8.2, 60, False, id="a-small-move-no-write"),
        pytest.param(1.0, 60, True, id="the-advice-changes"),
        pytest.param(8.0, 600, True, id="checkpoint-for-a-restart"),
    ],
)
def test_a_round_writes_only_what_is_worth_a_write(rate: float, later_s: int, written: bool) -> None:
    base = basemodel()
    (first,) = advise_basemodel(base, [adapter("a")], [view(a=8.0)], NOW)
    assert first.status  # the first advice is always written
    stored_adapter = adapter("a", merge=first.status["merge"])
    stored_adapter["status"]["conditions"] = first.status["conditions"]
    memories = {"uid-a": first.memory}
    (second,) = advise_basemodel(base, [stored_adapter], [view(a=rate)], NOW + timedelta(seconds=later_s), memories)
    assert bool(second.status) == written
    assert second.memory.sampled_at_s == (NOW + timedelta(seconds=later_s)).timestamp()  # the shell keeps it


@pytest.mark.parametrize(
    ("old", "fields", "want"),
    [
        pytest.param({}, {"merge": {"suggested": "Merged"}}, {"merge": {"suggested": "Merged"}}, id="first"),
        pytest.param({"merge": {"suggested": "Dynamic", "crossingSince": LONG_AGO}},
                     {"merge": {"suggested": "Dynamic"}}, {"merge": {"crossingSince": None}},
                     id="a-cleared-clock-is-removed"),
        pytest.param({"merge": {"suggested": "Dynamic"}, "conditions": [{"type": "X"}]},
                     {"merge": {"suggested": "Dynamic"}, "conditions": [{"type": "X"}]}, {}, id="nothing"),
        pytest.param({"conditions": [{"type": "X"}]}, {"conditions": [{"type": "Y"}]}, {"conditions": [{"type": "Y"}]},
                     id="conditions-whole"),
    ],
)
def test_status_patch(old: Obj, fields: Obj, want: Obj) -> None:
    assert status_patch(old, fields) == want


def test_a_non_auto_adapter_loses_a_stale_choice() -> None:
    (advice,) = advise_basemodel(basemodel(), [adapter("a", "dynamic", {"mode": "merged"})], [view(a=1.0)], NOW)
    assert "mode" not in advice.status["merge"]
    assert status_patch({"merge": {"mode": "merged"}}, advice.status)["merge"]["mode"] is None
