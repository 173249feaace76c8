"""The collect Job: removes directories of the engine or adapter volume that nothing uses any more.

A small Job in trtfleet's image (on ``convert_node_selector`` nodes, capabilities dropped) that
mounts one PVC at ``/volume`` and runs :mod:`trtfleet_operator.jobs.collect` on paths inside it. Adapters'
artifacts are collected when the last Adapter using them is deleted; engines and staged checkpoints when
their record has been unused for the retention period.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from trtfleet_operator.builders.common import (
    Obj,
    container_security,
    metadata,
    pod_security,
    pull_secrets,
    pvc_volume,
)
from trtfleet_operator.config import OperatorConfig
from trtfleet_operator.names import COMPONENT_COLLECT

COLLECT_CONTAINER = "collect"
COLLECT_MOUNT = "/volume"
COLLECT_RESOURCES: Obj = {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}}
COLLECT_TTL_S = 3600
"""A finished collect Job stays this long for ``kubectl describe``, then Kubernetes removes it."""


def build_collect_job(
    *,
    name: str,
    namespace: str,
    claim: str,
    paths: Sequence[str],
    config: OperatorConfig,
    owners: Sequence[Mapping[str, Any]] = (),
    labels: Mapping[str, str] | None = None,
    as_root: bool = False,
) -> Obj:
    """The Job that removes ``paths`` (relative to the root of PVC ``claim``); ``as_root`` for the engine
    volume, whose files NVIDIA's images (root) wrote."""
    security = pod_security(non_root=not as_root)
    if as_root:
        security.update(runAsUser=0, runAsNonRoot=False)
    container: Obj = {
        "name": COLLECT_CONTAINER,
        "image": config.images.trtfleet,
        "imagePullPolicy": "IfNotPresent",
        "command": ["python3", "-m", "trtfleet_operator.jobs.collect", "--root", COLLECT_MOUNT],
        "args": [arg for path in paths for arg in ("--remove", path)],
        "resources": COLLECT_RESOURCES,
        "volumeMounts": [{"name": "volume", "mountPath": COLLECT_MOUNT}],
        "securityContext": container_security(),
    }
    pod_labels = {**metadata("x", namespace, component=COMPONENT_COLLECT)["labels"], **(labels or {})}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata(name, namespace, component=COMPONENT_COLLECT, labels=labels, owners=owners),
        "spec": {
            "backoffLimit": config.convert_backoff_limit,
            "ttlSecondsAfterFinished": COLLECT_TTL_S,
            "template": {
                "metadata": {"labels": pod_labels},
                "spec": {
                    "restartPolicy": "Never",
                    "enableServiceLinks": False,
                    **(
                        {"nodeSelector": dict(sorted(config.convert_node_selector))}
                        if config.convert_node_selector
                        else {}
                    ),
                    "securityContext": security,
                    **pull_secrets(config.image_pull_secrets),
                    "containers": [container],
                    "volumes": [pvc_volume("volume", claim)],
                },
            },
        },
    }
