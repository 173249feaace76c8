"""Kubernetes discovery's translations: EndpointSlices, Adapters and BaseModels into a snapshot (pure)."""

from __future__ import annotations

import pytest
import yaml
from trtfleet_router.discovery.kubernetes import (
    adapter_entry_from_object,
    base_entry_from_object,
    build_snapshot,
    merged_fleet_from_object,
    pods_from_endpointslices,
)

from tests.unit.router.discovery.objects import ROOT, adapter_doc, basemodel_doc, endpoint, slice_for


def test_endpointslices_to_pods() -> None:
    pods = pods_from_endpointslices(
        [
            slice_for(
                "tiny",
                [
                    endpoint("10.1.0.5", "tiny-0", "u0", ready=True),
                    endpoint("10.1.0.6", "tiny-1", "u1", ready=False),
                    endpoint("fd00::7", "tiny-2", "u2", ready=True, terminating=True),
                    {"addresses": ["10.1.0.8"]},
                ],
            ),
            slice_for("other", [endpoint("10.2.0.1", "o-0", "v0")], ports=[{"name": "http", "port": 8000}]),
            {"metadata": {"name": "unlabelled"}, "endpoints": [endpoint("10.9.9.9", "x", "y")]},
        ]
    )
    assert set(pods) == {"tiny", "other"}
    other = pods["other"]["o-0"]  # runtime pytorch: trtllm-serve's port named http is the only one
    assert other.address == other.http_address == "10.2.0.1:8000" and other.metrics_url is None
    tiny = pods["tiny"]
    assert tiny["tiny-0"].address == "10.1.0.5:8001" and tiny["tiny-0"].ready
    assert tiny["tiny-0"].metrics_url == "http://10.1.0.5:8002/metrics"
    assert not tiny["tiny-1"].ready and not tiny["tiny-2"].ready and tiny["tiny-2"].address == "[fd00::7]:8001"
    assert tiny["10.1.0.8"].ready  # no conditions: ready, as the API defines


def test_new_pod_uid_or_ip_changes_identity() -> None:
    first = pods_from_endpointslices([slice_for("tiny", [endpoint("10.1.0.5", "tiny-0", "u0")])])["tiny"]["tiny-0"]
    moved = pods_from_endpointslices([slice_for("tiny", [endpoint("10.1.0.9", "tiny-0", "u0")])])["tiny"]["tiny-0"]
    restarted = pods_from_endpointslices([slice_for("tiny", [endpoint("10.1.0.5", "tiny-0", "u9")])])["tiny"]["tiny-0"]
    assert len({first.uid, moved.uid, restarted.uid}) == 3


def test_adapter_objects() -> None:
    entry = adapter_entry_from_object(adapter_doc("up", served="tiny-upper"), {})
    assert entry is not None
    assert (entry.served_name, entry.task_id, entry.artifact_uri, entry.min_pods) == (
        "tiny-upper",
        3,
        "s3://bucket/a",
        2,
    )
    assert adapter_entry_from_object(adapter_doc("up", phase="Converting"), {}) is None
    assert adapter_entry_from_object(adapter_doc("up", task_id=None), {}) is None
    assert adapter_entry_from_object({"metadata": {"name": "broken"}, "spec": {}}, {}) is None
    deleting = adapter_doc("up", served="tiny-upper")
    deleting["metadata"]["deletionTimestamp"] = "2026-12-01T00:00:00Z"
    assert adapter_entry_from_object(deleting, {}) is None  # unregistered while the operator drains it


def test_build_snapshot() -> None:
    snapshot = build_snapshot(
        [basemodel_doc()],
        [adapter_doc("up"), adapter_doc("late", phase="Pending")],
        [
            slice_for("tiny", [endpoint("10.1.0.5", "tiny-0", "u0")]),
            slice_for("unknown-base", [endpoint("10.1.0.6", "z", "z")]),
        ],
    )
    base = snapshot.registry.bases["tiny"]
    assert (base.upstream_model, base.host_pages, base.device_pages) == ("ensemble", 5, 2)
    assert snapshot.registry.served_names() == ["tiny", "up"]
    assert set(snapshot.pods) == {"tiny"} and set(snapshot.pods["tiny"]) == {"tiny-0"}


def test_pytorch_base_model_and_adapter_carry_runtime_and_lora_path() -> None:
    doc = yaml.safe_load((ROOT / "examples" / "basemodel-llama3-8b-pytorch.yaml").read_text())
    doc["metadata"] = {"name": "tiny"}
    doc["status"] = {"phase": "Ready", "capacity": {"loraHostPages": 12, "loraDevicePages": 4, "maxLoras": 2}}
    adapter = adapter_doc("up")
    adapter["status"]["artifact"]["path"] = "/models/adapters/up-3"
    slice_ = slice_for("tiny", [endpoint("10.1.0.5", "tiny-0", "u0")], ports=[{"name": "http", "port": 8000}])
    snapshot = build_snapshot([doc], [adapter], [slice_])
    base, entry = snapshot.registry.bases["tiny"], snapshot.registry.adapters["up"]
    assert base.serves_openai and (base.host_pages, base.device_pages) == (12, 4)
    assert entry.lora_path == "/models/adapters/up-3" and entry.ref.read_by_pod
    assert snapshot.pods["tiny"]["tiny-0"].address == "10.1.0.5:8000"
    triton = build_snapshot([basemodel_doc()], [adapter], [])
    assert triton.registry.adapters["up"].lora_path == ""  # a Triton base model gets the weights sent


@pytest.mark.parametrize(
    ("mode", "chosen", "served"),
    [
        pytest.param("merged", None, True, id="merged-keeps-its-fallback-while-building"),
        pytest.param("auto", "merged", True, id="auto-served-merged-keeps-it-too"),
        pytest.param("auto", "dynamic", False, id="auto-dynamic-waits-for-ready"),
        pytest.param("auto", None, False, id="auto-before-any-advice-is-dynamic"),
        pytest.param("dynamic", "merged", False, id="a-stale-choice-of-a-non-auto-adapter-is-ignored"),
    ],
)
def test_a_merged_adapter_is_served_hot_swapped_whatever_its_phase(mode: str, chosen: str | None, served: bool) -> None:
    obj = adapter_doc("up", phase="Pending")
    obj["spec"]["mode"] = mode
    if chosen is not None:
        obj["status"]["merge"] = {"mode": chosen}
    assert (adapter_entry_from_object(obj, {}) is not None) == served
    base = base_entry_from_object(basemodel_doc())
    assert base is not None
    fleet = merged_fleet_from_object(obj, {"tiny": base})
    assert (fleet is not None) == served  # its merged fleet exists from the switch on, pods or not
    assert fleet is None or fleet.merged_adapter == "up"
