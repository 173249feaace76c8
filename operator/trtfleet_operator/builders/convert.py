"""The adapter-conversion Job: a small CPU Job running ``trtfleet lora convert`` into the artifact PVC.

Its entrypoint (:mod:`trtfleet_operator.jobs.convert`) writes a JSON summary of the converted manifest to
the termination message, which the operator reads from the pod status (``FallbackToLogsOnError`` turns a
crash's log tail into the message). The output directory is content-addressed,
``<artifact mount>/<sourceKey>-<dtype>`` (``-phi3`` appended for Phi-3, whose fused ``gate_up_proj`` maps to
another module id), so Adapters with the same source share one artifact and a new revision gets a new
directory. Adapters of ``runtime: reference`` BaseModels convert in the
reference-worker image, which ships the sample adapters (``file:///opt/trtfleet/adapters/...``).

Adapters of ``runtime: pytorch`` BaseModels run the same Job with ``--stage-peft``: the conversion only
validates, and the PEFT directory itself is staged (directory suffix ``-peft``), because ``trtllm-serve``
reads adapters from ``lora_path``. Serving pods mount the artifact PVC read-only at the same
``artifact_mount`` the Job writes to, so :func:`artifact_path` is the path every pod reads.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlparse

from trtfleet_engines.lora.peft import ARCHITECTURE_MODULES
from trtfleet_engines.plan import PVC_MOUNT_ROOT

from trtfleet.api import BaseModelSpec, Runtime, Source
from trtfleet_operator.builders.common import (
    Obj,
    container_security,
    env_from_secret,
    metadata,
    pod_security,
    pull_secrets,
    pvc_volume,
)
from trtfleet_operator.config import OperatorConfig
from trtfleet_operator.names import (
    ANNOTATION_SOURCE_URI,
    COMPONENT_ADAPTER_CONVERT,
    LABEL_ADAPTER,
    LABEL_BASEMODEL,
    LABEL_SOURCE_KEY,
    convert_job_name,
    digest,
    label_value,
)

CONVERT_CONTAINER = "convert"
ARTIFACTS_VOLUME = "artifacts"
CONVERT_RESOURCES: Obj = {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"memory": "8Gi"}}
"""Conversion holds one adapter's tensors in memory a few times over (rank-64 8B adapters: ~0.7 GB)."""


def module_mapping(base: BaseModelSpec) -> str | None:
    """The architecture whose HF -> TRT-LLM module mapping differs from the Llama family's (``phi3``: a fused
    ``gate_up_proj`` is ``mlp_h_to_4h``), or None; it is part of the artifact's identity."""
    return base.architecture.value if base.architecture in ARCHITECTURE_MODULES else None


def stages_peft(base: BaseModelSpec) -> bool:
    """Whether the Adapter's PEFT directory itself is staged (``runtime: pytorch``), not its conversion."""
    return base.runtime is Runtime.PYTORCH


def artifact_dir(source_key: str, dtype: str, mapping: str | None = None, *, peft: bool = False) -> str:
    """The artifact's directory inside the artifact PVC."""
    return f"{source_key}-{dtype}" + (f"-{mapping}" if mapping else "") + ("-peft" if peft else "")


def artifact_uri(
    config: OperatorConfig, source_key: str, dtype: str, mapping: str | None = None, *, peft: bool = False
) -> str:
    return f"pvc://{config.storage.artifact_pvc}/{artifact_dir(source_key, dtype, mapping, peft=peft)}"


def artifact_path(config: OperatorConfig, source_key: str, dtype: str, mapping: str | None = None) -> str:
    """Where a ``pytorch`` pod reads the staged PEFT directory: ``lora_request.lora_path``."""
    return f"{config.storage.artifact_mount}/{artifact_dir(source_key, dtype, mapping, peft=True)}"


def conversion_id(source_key: str, dtype: str, mapping: str | None = None, *, peft: bool = False) -> str:
    """What one conversion is keyed by (the Job name carries it): the source, the target dtype and, where it
    differs from the Llama family's, the module mapping; staging the PEFT directory is another conversion."""
    key = {"sourceKey": source_key, "dtype": dtype}
    if mapping:
        key["mapping"] = mapping
    if peft:
        key["format"] = "peft"
    return digest(key, 16)


def convert_image(base: BaseModelSpec, config: OperatorConfig) -> str:
    return config.images.worker if base.runtime is Runtime.REFERENCE else config.images.trtfleet


def build_convert_job(
    *,
    adapter: str,
    namespace: str,
    owner: Mapping[str, Any],
    source: Source,
    source_key: str,
    basemodel: str,
    base: BaseModelSpec,
    config: OperatorConfig,
) -> Obj:
    dtype = base.dtype.value
    mapping = module_mapping(base)
    peft = stages_peft(base)
    out = f"{config.storage.artifact_mount}/{artifact_dir(source_key, dtype, mapping, peft=peft)}"
    labels = {
        LABEL_ADAPTER: label_value(adapter),
        LABEL_BASEMODEL: label_value(basemodel),
        LABEL_SOURCE_KEY: source_key,
    }
    mounts: list[Obj] = [
        {"name": ARTIFACTS_VOLUME, "mountPath": config.storage.artifact_mount},
        {"name": "work", "mountPath": "/work"},
    ]
    volumes: list[Obj] = [
        pvc_volume(ARTIFACTS_VOLUME, config.storage.artifact_pvc),
        {"name": "work", "emptyDir": {}},
    ]
    parsed = urlparse(source.uri)
    if parsed.scheme == "pvc":
        mounts.append({"name": "source", "mountPath": f"{PVC_MOUNT_ROOT}/{parsed.netloc}", "readOnly": True})
        volumes.append(pvc_volume("source", parsed.netloc, read_only=True))
    container: Obj = {
        "name": CONVERT_CONTAINER,
        "image": convert_image(base, config),
        "imagePullPolicy": "IfNotPresent",
        "command": ["python3", "-m", "trtfleet_operator.jobs.convert"],
        "args": [
            "--source-uri",
            source.uri,
            "--revision",
            source.revision or "",
            "--out",
            out,
            "--dtype",
            dtype,
            *(["--architecture", mapping] if mapping else []),
            *(["--stage-peft"] if peft else []),
        ],
        "resources": CONVERT_RESOURCES,
        "volumeMounts": mounts,
        "securityContext": container_security(),
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    if source.secret_ref is not None:
        container["envFrom"] = env_from_secret(source.secret_ref.name)
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata(
            convert_job_name(adapter, conversion_id(source_key, dtype, mapping, peft=peft)),
            namespace,
            component=COMPONENT_ADAPTER_CONVERT,
            labels=labels,
            annotations={ANNOTATION_SOURCE_URI: source.uri},
            owners=[owner],
        ),
        "spec": {
            "backoffLimit": config.convert_backoff_limit,
            "activeDeadlineSeconds": config.convert_deadline_s,
            "template": {
                "metadata": {
                    "labels": {
                        **metadata("x", namespace, component=COMPONENT_ADAPTER_CONVERT)["labels"],
                        **labels,
                    }
                },
                "spec": {
                    "restartPolicy": "Never",
                    "enableServiceLinks": False,
                    **(
                        {"nodeSelector": dict(sorted(config.convert_node_selector))}
                        if config.convert_node_selector
                        else {}
                    ),
                    "securityContext": pod_security(non_root=True),
                    **pull_secrets(config.image_pull_secrets),
                    "containers": [container],
                    "volumes": volumes,
                },
            },
        },
    }
