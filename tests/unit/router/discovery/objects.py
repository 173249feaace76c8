"""Kubernetes objects as discovery reads them from the API server: EndpointSlices, BaseModels and Adapters."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[4]


def slice_for(base: str, endpoints: list[dict[str, Any]], ports: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """An EndpointSlice of ``base``'s serving pods (ports ``grpc`` 8001 and ``metrics`` 8002 unless given)."""
    return {
        "metadata": {"name": f"{base}-x", "labels": {"trtfleet.io/basemodel": base}},
        "ports": ports if ports is not None else [{"name": "grpc", "port": 8001}, {"name": "metrics", "port": 8002}],
        "endpoints": endpoints,
    }


def endpoint(ip: str, name: str, uid: str, **conditions: bool) -> dict[str, Any]:
    """One endpoint of a slice: the pod's address, its conditions (none: ready) and its reference."""
    return {"addresses": [ip], "conditions": conditions, "targetRef": {"kind": "Pod", "name": name, "uid": uid}}


def basemodel_doc(name: str = "tiny") -> dict[str, Any]:
    """The tiny reference BaseModel of ``examples/``, Ready, with its LoRA cache capacity in the status."""
    doc = yaml.safe_load((ROOT / "examples" / "basemodel-reference-tiny.yaml").read_text())
    doc["metadata"] = {"name": name, "annotations": {"trtfleet.io/upstream-model": "ensemble"}}
    doc["status"] = {"phase": "Ready", "capacity": {"loraHostPages": 5, "loraDevicePages": 2}}
    return dict(doc)


def adapter_doc(name: str, phase: str = "Ready", task_id: int | None = 3, served: str | None = None) -> dict[str, Any]:
    """An Adapter of the tiny base model with a converted artifact (``task_id`` None: none allocated yet)."""
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
