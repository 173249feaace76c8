"""Discovery translations: fleet file / flags, EndpointSlices, Adapters and BaseModels (pure)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from trtfleet_router.discovery.kubernetes import (
    adapter_entry_from_object,
    base_entry_from_object,
    build_snapshot,
    merged_fleet_from_object,
    pods_from_endpointslices,
)
from trtfleet_router.discovery.static import (
    StaticDiscovery,
    config_from_flags,
    load_fleet_config,
    snapshot_from_config,
)

from tests.unit.router.harness import write_artifact

ROOT = Path(__file__).resolve().parents[4]


def test_fleet_file(tmp_path: Path) -> None:
    write_artifact(tmp_path / "adapters" / "upper")
    spec = yaml.safe_load((ROOT / "examples" / "basemodel-reference-tiny.yaml").read_text())["spec"]
    (tmp_path / "fleet.yaml").write_text(
        yaml.safe_dump(
            {
                "baseModels": [
                    {
                        "name": "tiny",
                        "spec": spec,
                        "hostPages": 3,
                        "backends": [
                            "10.0.0.1:8001/8002",
                            {"address": "10.0.0.2:8001", "podId": "w2", "metrics": "10.0.0.2:8002"},
                        ],
                        "adapters": [
                            {"servedName": "tiny-upper", "taskId": 4, "artifact": "adapters/upper", "minPods": 1}
                        ],
                    }
                ]
            }
        )
    )
    snapshot = StaticDiscovery(path=tmp_path / "fleet.yaml").initial()
    base = snapshot.registry.bases["tiny"]
    assert base.architecture == "reference" and base.host_pages == 3 and base.limits.max_input_tokens == 128
    adapter = snapshot.registry.adapters["tiny-upper"]
    assert adapter.artifact_uri == str(tmp_path / "adapters" / "upper") and adapter.weights_bytes == 128
    assert adapter.min_pods == 1 and adapter.pages >= 1
    pods = snapshot.pods["tiny"]
    assert pods["10.0.0.1:8001"].metrics_url == "http://10.0.0.1:8002/metrics"
    assert pods["w2"].address == "10.0.0.2:8001" and pods["w2"].uid == "10.0.0.2:8001"


def test_invalid_fleet_file(tmp_path: Path) -> None:
    (tmp_path / "fleet.yaml").write_text("baseModels: [{name: x, bogus: 1}]")
    with pytest.raises(ValueError, match="invalid fleet configuration"):
        load_fleet_config(tmp_path / "fleet.yaml")


def test_flags() -> None:
    config = config_from_flags(
        base_model="tiny",
        backends=["127.0.0.1:1/2,127.0.0.1:3"],
        adapters=["up=5:/data/up"],
        architecture="qwen2",
        max_input_len=10,
        max_seq_len=20,
        host_pages=None,
        device_pages=None,
        upstream_model="ensemble",
    )
    snapshot = snapshot_from_config(config)
    assert set(snapshot.pods["tiny"]) == {"127.0.0.1:1", "127.0.0.1:3"}
    assert snapshot.registry.bases["tiny"].upstream_model == "ensemble"
    assert snapshot.registry.resolve("up").adapter is not None
    with pytest.raises(ValueError, match="name=task_id:artifact_dir"):
        config_from_flags(
            base_model="t",
            backends=[],
            adapters=["bad"],
            architecture="llama",
            max_input_len=1,
            max_seq_len=2,
            host_pages=None,
            device_pages=None,
            upstream_model="m",
        )


def _slice(base: str, endpoints: list[dict[str, Any]], ports: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": f"{base}-x", "labels": {"trtfleet.io/basemodel": base}},
        "ports": ports if ports is not None else [{"name": "grpc", "port": 8001}, {"name": "metrics", "port": 8002}],
        "endpoints": endpoints,
    }


def _endpoint(ip: str, name: str, uid: str, **conditions: bool) -> dict[str, Any]:
    return {"addresses": [ip], "conditions": conditions, "targetRef": {"kind": "Pod", "name": name, "uid": uid}}


def test_endpointslices_to_pods() -> None:
    pods = pods_from_endpointslices(
        [
            _slice(
                "tiny",
                [
                    _endpoint("10.1.0.5", "tiny-0", "u0", ready=True),
                    _endpoint("10.1.0.6", "tiny-1", "u1", ready=False),
                    _endpoint("fd00::7", "tiny-2", "u2", ready=True, terminating=True),
                    {"addresses": ["10.1.0.8"]},
                ],
            ),
            _slice("other", [_endpoint("10.2.0.1", "o-0", "v0")], ports=[{"name": "http", "port": 8000}]),
            {"metadata": {"name": "unlabelled"}, "endpoints": [_endpoint("10.9.9.9", "x", "y")]},
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
    first = pods_from_endpointslices([_slice("tiny", [_endpoint("10.1.0.5", "tiny-0", "u0")])])["tiny"]["tiny-0"]
    moved = pods_from_endpointslices([_slice("tiny", [_endpoint("10.1.0.9", "tiny-0", "u0")])])["tiny"]["tiny-0"]
    restarted = pods_from_endpointslices([_slice("tiny", [_endpoint("10.1.0.5", "tiny-0", "u9")])])["tiny"]["tiny-0"]
    assert len({first.uid, moved.uid, restarted.uid}) == 3


def _basemodel(name: str = "tiny") -> dict[str, Any]:
    doc = yaml.safe_load((ROOT / "examples" / "basemodel-reference-tiny.yaml").read_text())
    doc["metadata"] = {"name": name, "annotations": {"trtfleet.io/upstream-model": "ensemble"}}
    doc["status"] = {"phase": "Ready", "capacity": {"loraHostPages": 5, "loraDevicePages": 2}}
    return dict(doc)


def _adapter(name: str, phase: str = "Ready", task_id: int | None = 3, served: str | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {
        "phase": phase,
        "artifact": {"uri": "s3://bucket/a", "sha256": "ab" * 32, "bytes": 1000, "rank": 8, "modules": ["attn_q"]},
    }
    if task_id is not None:
        status["taskId"] = task_id
    spec: dict[str, Any] = {"baseModel": "tiny", "source": {"uri": "file:///x"}, "warm": {"minPods": 2}}
    if served:
        spec["servedName"] = served
    return {
        "apiVersion": "trtfleet.io/v1alpha1",
        "kind": "Adapter",
        "metadata": {"name": name},
        "spec": spec,
        "status": status,
    }


def test_adapter_objects() -> None:
    entry = adapter_entry_from_object(_adapter("up", served="tiny-upper"), {})
    assert entry is not None
    assert (entry.served_name, entry.task_id, entry.artifact_uri, entry.min_pods) == (
        "tiny-upper",
        3,
        "s3://bucket/a",
        2,
    )
    assert adapter_entry_from_object(_adapter("up", phase="Converting"), {}) is None
    assert adapter_entry_from_object(_adapter("up", task_id=None), {}) is None
    assert adapter_entry_from_object({"metadata": {"name": "broken"}, "spec": {}}, {}) is None


def test_build_snapshot() -> None:
    snapshot = build_snapshot(
        [_basemodel()],
        [_adapter("up"), _adapter("late", phase="Pending")],
        [
            _slice("tiny", [_endpoint("10.1.0.5", "tiny-0", "u0")]),
            _slice("unknown-base", [_endpoint("10.1.0.6", "z", "z")]),
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
    adapter = _adapter("up")
    adapter["status"]["artifact"]["path"] = "/models/adapters/up-3"
    slice_ = _slice("tiny", [_endpoint("10.1.0.5", "tiny-0", "u0")], ports=[{"name": "http", "port": 8000}])
    snapshot = build_snapshot([doc], [adapter], [slice_])
    base, entry = snapshot.registry.bases["tiny"], snapshot.registry.adapters["up"]
    assert base.serves_openai and (base.host_pages, base.device_pages) == (12, 4)
    assert entry.lora_path == "/models/adapters/up-3" and entry.ref.read_by_pod
    assert snapshot.pods["tiny"]["tiny-0"].address == "10.1.0.5:8000"
    triton = build_snapshot([_basemodel()], [adapter], [])
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
    obj = _adapter("up", phase="Pending")
    obj["spec"]["mode"] = mode
    if chosen is not None:
        obj["status"]["merge"] = {"mode": chosen}
    assert (adapter_entry_from_object(obj, {}) is not None) == served
    base = base_entry_from_object(_basemodel())
    assert base is not None
    fleet = merged_fleet_from_object(obj, {"tiny": base})
    assert (fleet is not None) == served  # its merged fleet exists from the switch on, pods or not
    assert fleet is None or fleet.merged_adapter == "up"
