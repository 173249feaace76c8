"""Kubernetes discovery of a merged Adapter: its pods form a fleet of their own, never the base model's pool."""

from __future__ import annotations

from typing import Any

from trtfleet_operator.builders.service import build_service
from trtfleet_operator.names import merged_serving_name, serving_name
from trtfleet_router.discovery.kubernetes import build_snapshot

from tests.unit.router.discovery.objects import adapter_doc, basemodel_doc, endpoint, slice_for


def _merged_slice(adapter: str, ip: str, pod: str) -> dict[str, Any]:
    slice_ = slice_for("tiny", [endpoint(ip, pod, pod)])
    slice_["metadata"]["labels"] |= {"trtfleet.io/adapter": adapter, "trtfleet.io/role": "merged"}
    return slice_


def _merged_adapter(name: str, served: str) -> dict[str, Any]:
    obj = adapter_doc(name, phase="Pending", task_id=None, served=served)  # merged: no task id, no artifact
    obj["spec"]["mode"] = "merged"
    del obj["status"]["artifact"]
    return obj


def test_merged_pods_are_the_adapters_fleet_with_its_dynamic_twin_behind() -> None:
    snapshot = build_snapshot(
        [basemodel_doc()],
        [_merged_adapter("upper-merged", "tiny-upper"), adapter_doc("upper", served="tiny-upper")],
        [slice_for("tiny", [endpoint("10.1.0.5", "tiny-0", "u0")]), _merged_slice("upper-merged", "10.1.0.9", "m-0")],
    )
    assert set(snapshot.pods["tiny"]) == {"tiny-0"}  # the merged pod is not in the shared pool
    assert set(snapshot.pods["tiny-upper@merged"]) == {"m-0"}
    target = snapshot.registry.resolve("tiny-upper")
    assert (target.base.name, target.adapter) == ("tiny-upper@merged", None)
    assert target.fallback is not None and target.fallback.base.name == "tiny"
    assert target.fallback.adapter is not None and target.fallback.adapter.task_id == 3


def test_a_merged_adapter_without_pods_still_owns_its_name() -> None:
    snapshot = build_snapshot([basemodel_doc()], [_merged_adapter("upper-merged", "tiny-upper")], [])
    assert snapshot.pods["tiny-upper@merged"] == {}
    assert snapshot.registry.resolve("tiny-upper").fallback is None
    assert snapshot.registry.served_names() == ["tiny", "tiny-upper"]


def test_switching_to_merged_keeps_the_dynamic_artifact_behind_the_merged_pods() -> None:
    # dynamic -> merged on one object: the status still carries the dynamic task id and artifact
    switched = adapter_doc("upper", phase="Converting", served="tiny-upper")
    switched["spec"]["mode"] = "merged"
    pods = [slice_for("tiny", [endpoint("10.1.0.5", "tiny-0", "u0")])]
    snapshot = build_snapshot([basemodel_doc()], [switched], pods)
    target = snapshot.registry.resolve("tiny-upper")
    assert target.base.name == "tiny-upper@merged" and snapshot.pods["tiny-upper@merged"] == {}
    assert target.fallback is not None and target.fallback.adapter is not None
    assert (target.fallback.base.name, target.fallback.adapter.task_id) == ("tiny", 3)


def test_switching_back_to_dynamic_keeps_the_merged_pods_until_the_operator_removes_them() -> None:
    converting = adapter_doc("upper-merged", phase="Converting", task_id=None, served="tiny-upper")  # mode dynamic
    pods = [_merged_slice("upper-merged", "10.1.0.9", "m-0")]
    snapshot = build_snapshot([basemodel_doc()], [converting], pods)
    assert snapshot.registry.resolve("tiny-upper").base.name == "tiny-upper@merged"  # nothing lost meanwhile
    ready = adapter_doc("upper-merged", served="tiny-upper")
    target = build_snapshot([basemodel_doc()], [ready], pods).registry.resolve("tiny-upper")
    assert target.fallback is not None and target.fallback.base.name == "tiny"
    gone = build_snapshot([basemodel_doc()], [ready], []).registry.resolve("tiny-upper")  # the pods deleted
    assert (gone.base.name, gone.fallback) == ("tiny", None)


def _slice_of_service(service: dict[str, Any], ip: str, pod: str) -> dict[str, Any]:
    """The EndpointSlice the controller makes for ``service``: its labels are the Service's."""
    slice_ = slice_for("unused", [endpoint(ip, pod, pod)], [{"name": "grpc", "port": 8001}])
    slice_["metadata"]["labels"] = dict(service["metadata"]["labels"])
    return slice_


def test_names_over_63_characters_match_the_labels_the_operator_writes() -> None:
    """The operator hashes names that do not fit a label value; the router must look them up the same way."""
    base_name, adapter_name = "b" * 70, "merged-" + "a" * 63
    assert len(adapter_name) == 70
    owner = {"apiVersion": "trtfleet.io/v1alpha1", "kind": "BaseModel", "name": base_name, "uid": "u"}
    base_service = build_service(name=serving_name(base_name), namespace="ns", owner=owner, basemodel=base_name)
    merged_service = build_service(
        name=merged_serving_name(adapter_name), namespace="ns", owner=owner, basemodel=base_name, adapter=adapter_name
    )
    assert merged_service["metadata"]["labels"]["trtfleet.io/adapter"] != adapter_name  # hashed to fit
    adapter = _merged_adapter(adapter_name, "long-merged")
    adapter["spec"]["baseModel"] = base_name
    snapshot = build_snapshot(
        [basemodel_doc(base_name)],
        [adapter],
        [_slice_of_service(base_service, "10.1.0.5", "base-0"), _slice_of_service(merged_service, "10.1.0.9", "m-0")],
    )
    assert set(snapshot.pods[base_name]) == {"base-0"}
    assert set(snapshot.pods["long-merged@merged"]) == {"m-0"}
