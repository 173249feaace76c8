"""Pieces every builder shares: object metadata, volumes, pod scheduling and resources.

All builders are pure and deterministic: the same inputs give the same dict (maps are compared and
golden-filed with sorted keys; lists are built in a fixed order).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from trtfleet.api.basemodel import BaseModelSpec, RolloutStrategy
from trtfleet_operator.names import common_labels

GPU_RESOURCE = "nvidia.com/gpu"
SHM_VOLUME = "dshm"
ENGINES_VOLUME = "engines"

Obj = dict[str, Any]


def metadata(
    name: str,
    namespace: str,
    *,
    component: str,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    owners: Sequence[Mapping[str, Any]] = (),
) -> Obj:
    meta: Obj = {
        "name": name,
        "namespace": namespace,
        "labels": {**common_labels(component), **(labels or {})},
    }
    if annotations:
        meta["annotations"] = dict(annotations)
    if owners:
        meta["ownerReferences"] = [dict(owner) for owner in owners]
    return meta


def shm_volume() -> Obj:
    """``/dev/shm`` in memory: Triton's python backend and NCCL need more than the 64 MiB default."""
    return {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory"}}


def shm_mount() -> Obj:
    return {"name": SHM_VOLUME, "mountPath": "/dev/shm"}


def pvc_volume(name: str, claim: str, *, read_only: bool = False) -> Obj:
    source: Obj = {"claimName": claim}
    if read_only:
        source["readOnly"] = True
    return {"name": name, "persistentVolumeClaim": source}


def env_from_secret(spec_secret: str | None) -> list[Obj]:
    return [{"secretRef": {"name": spec_secret}}] if spec_secret else []


def scheduling(spec: BaseModelSpec) -> Obj:
    """nodeSelector and tolerations of ``spec.serving`` (build Jobs use them too: an engine only runs on
    the GPU architecture that built it)."""
    out: Obj = {}
    serving = spec.serving
    if serving.node_selector:
        out["nodeSelector"] = dict(sorted(serving.node_selector.items()))
    if serving.tolerations:
        out["tolerations"] = [t.to_wire() for t in serving.tolerations]
    return out


def gpu_resources(spec: BaseModelSpec, *, gpus: bool) -> Obj:
    """``spec.serving.resources`` with ``nvidia.com/gpu: engine.gpu.count`` added when ``gpus``."""
    requests: dict[str, Any] = {}
    limits: dict[str, Any] = {}
    if spec.serving.resources is not None:
        requests.update(spec.serving.resources.requests or {})
        limits.update(spec.serving.resources.limits or {})
    if gpus:
        limits.setdefault(GPU_RESOURCE, spec.engine.gpu.count)
        requests.setdefault(GPU_RESOURCE, limits[GPU_RESOURCE])
    out: Obj = {}
    if requests:
        out["requests"] = dict(sorted(requests.items()))
    if limits:
        out["limits"] = dict(sorted(limits.items()))
    return out


def pull_secrets(secrets: Sequence[str]) -> Obj:
    """``imagePullSecrets`` of a pod spec (empty: the key is left out), in the order configured."""
    return {"imagePullSecrets": [{"name": name} for name in secrets]} if secrets else {}


SERVING_CPU_PER_GPU = 2
"""CPU request per GPU of a serving pod: the HTTP front end, tokenizer and executor threads of each rank."""
SERVING_PROCESS_BYTES = 16 << 30
"""Host memory of a GPU serving process besides the host LoRA tier (CUDA context, weights staged through
host memory while loading, tokenizer, Python): a floor set by hand, not measured on a GPU here."""
MIB = 1 << 20


def serving_resources(spec: BaseModelSpec) -> Obj:
    """:func:`gpu_resources` of a GPU serving container, with CPU and memory requests that cover the host
    LoRA tier (``lora.cache.hostMemoryBytes``, pinned host memory) and the process, unless the spec sets them."""
    out = gpu_resources(spec, gpus=True)
    requests = dict(out.get("requests") or {})
    requests.setdefault("cpu", str(SERVING_CPU_PER_GPU * spec.engine.gpu.count))
    host_tier = spec.lora.cache.host_bytes if spec.lora.enabled else 0
    requests.setdefault("memory", _memory(host_tier + SERVING_PROCESS_BYTES))
    out["requests"] = dict(sorted(requests.items()))
    return out


def _memory(size_bytes: int) -> str:
    """A memory quantity in the API server's canonical form (whole GiB as ``Gi``, else ``Mi`` rounded up)."""
    mib = -(-size_bytes // MIB)
    return f"{mib // 1024}Gi" if mib % 1024 == 0 else f"{mib}Mi"


def rollout_strategy(spec: BaseModelSpec) -> Obj:
    """The Deployment strategy of ``spec.serving.rollout``: Surge (the default) or Replace, ``pods`` at once."""
    rollout = spec.serving.rollout
    pods = rollout.pods if rollout is not None else 1
    if rollout is not None and rollout.strategy is RolloutStrategy.REPLACE:
        return {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": pods, "maxSurge": 0}}
    return {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": pods}}


def sorted_env(items: Mapping[str, str]) -> list[Obj]:
    return [{"name": key, "value": value} for key, value in sorted(items.items())]


TRTFLEET_UID = 10001
"""The user of trtfleet's own images (images/*.Dockerfile)."""


def container_security() -> Obj:
    """Every operator-owned container: no privilege escalation, no capabilities (NVIDIA's images run as
    root by design; the device plugin grants GPU access without capabilities)."""
    return {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def pod_security(*, non_root: bool) -> Obj:
    """Pods of trtfleet's own images run as its user; NVIDIA's images need root."""
    security: Obj = {"seccompProfile": {"type": "RuntimeDefault"}}
    if non_root:
        security.update(runAsNonRoot=True, runAsUser=TRTFLEET_UID, runAsGroup=TRTFLEET_UID, fsGroup=TRTFLEET_UID)
    return security
