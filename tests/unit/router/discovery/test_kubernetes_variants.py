"""Kubernetes discovery of QLoRA Adapters: served on the base variant their status names, never on the plain
base model's pool; the variant's pods never join that pool either."""

from __future__ import annotations

from typing import Any

import pytest
from trtfleet_router.discovery.kubernetes import build_snapshot
from trtfleet_router.errors import ModelNotFound
from trtfleet_router.liveview import FleetSet
from trtfleet_router.routing.config import RoutingConfig

from tests.unit.router.discovery.objects import adapter_doc, basemodel_doc, endpoint, slice_for

VARIANT = "tiny-q-0123456789"
NF4 = {"quantType": "nf4", "blockSize": 64, "computeDtype": "float32"}


def _variant_slice(variant: str, ip: str, pod: str) -> dict[str, Any]:
    slice_ = slice_for("tiny", [endpoint(ip, pod, pod)])
    slice_["metadata"]["labels"] |= {"trtfleet.io/variant": variant, "trtfleet.io/role": "variant"}
    return slice_


def _qlora(name: str, served: str, variant: str | None = VARIANT) -> dict[str, Any]:
    obj = adapter_doc(name, served=served, task_id=5)
    obj["spec"]["training"] = {"baseQuantization": NF4}
    if variant is not None:
        obj["status"]["baseVariant"] = {"name": variant, "hash": "01" * 32, "quantization": "nf4:64:float32"}
    return obj


def test_a_qlora_adapter_goes_to_its_variants_pods_only() -> None:
    snapshot = build_snapshot(
        [basemodel_doc()],
        [_qlora("upper-qlora", "tiny-upper-qlora"), adapter_doc("upper", served="tiny-upper")],
        [slice_for("tiny", [endpoint("10.1.0.5", "tiny-0", "u0")]), _variant_slice(VARIANT, "10.1.0.7", "v-0")],
    )
    assert set(snapshot.pods["tiny"]) == {"tiny-0"}  # the variant pod is not in the plain pool
    assert set(snapshot.pods[f"{VARIANT}@variant"]) == {"v-0"}
    target = snapshot.registry.resolve("tiny-upper-qlora")
    assert target.base.name == f"{VARIANT}@variant" and target.fallback is None
    assert target.base.upstream_name == "tiny" and target.adapter is not None and target.adapter.task_id == 5
    assert snapshot.registry.resolve("tiny-upper").base.name == "tiny"  # plain adapters stay on the pool
    assert f"{VARIANT}@variant" not in snapshot.registry.served_names()
    with pytest.raises(ModelNotFound):  # no task id of the variant's adapters on the plain base
        snapshot.registry.adapter_by_task("tiny", 5)
    assert snapshot.registry.adapter_by_task(f"{VARIANT}@variant", 5).served_name == "tiny-upper-qlora"

    fleets = FleetSet(RoutingConfig())
    fleets.apply(snapshot)
    assert [p.pod_id for p in fleets.ready_endpoints(fleets.serving(target).base.name)] == ["v-0"]


def test_without_variant_pods_the_adapter_has_no_fallback_to_the_plain_base() -> None:
    snapshot = build_snapshot([basemodel_doc()], [_qlora("upper-qlora", "tiny-upper-qlora")],
                              [slice_for("tiny", [endpoint("10.1.0.5", "tiny-0", "u0")])])
    target = snapshot.registry.resolve("tiny-upper-qlora")
    assert snapshot.pods[f"{VARIANT}@variant"] == {} and target.fallback is None
    fleets = FleetSet(RoutingConfig())
    fleets.apply(snapshot)
    assert fleets.serving(target).base.name == f"{VARIANT}@variant"


def test_before_the_operator_names_a_variant_the_adapter_is_not_served() -> None:
    snapshot = build_snapshot([basemodel_doc()], [_qlora("upper-qlora", "tiny-upper-qlora", variant=None)],
                              [slice_for("tiny", [endpoint("10.1.0.5", "tiny-0", "u0")])])
    with pytest.raises(ModelNotFound):
        snapshot.registry.resolve("tiny-upper-qlora")
