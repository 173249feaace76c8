"""Engine-build objects: the plan ConfigMap, the build Job, and the record of a built engine.

One build per engine hash and namespace: the Job ``trtfleet-build-<hash16>`` (``-<attempt>`` from the
second attempt) runs ``trtfleet engines build --plan /plan/plan.json --out /engines/<hash>`` in
``spec.engine.image`` as written (``trtfleet`` comes from an init container, :mod:`.clibundle`), with the
plan from the ConfigMap ``trtfleet-plan-<hash16>``, the engine PVC at ``/engines``, ``pvc://`` source
claims where the plan reads them, and an emptyDir as the plan's scratch workdir (checkpoint conversion
needs room: give nodes ephemeral storage of about three model sizes).
Both are owned (non-controller owner references) by every BaseModel or merged Adapter that wants the
hash, so the garbage collector removes them when the last user goes and two users share one build.

The record ``trtfleet-engine-<hash16>`` (a ConfigMap without owners) is how the operator knows an engine
exists in the engine PVC: it is written when a build Job completes and outlives every Job and BaseModel,
like the artifact it describes. Deleting it makes the next reconcile start a build, which returns at
once if the engine's manifest is already in the PVC (the runner exits 0 then).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlparse

from trtfleet_engines.plan import DEFAULT_WORKDIR, PVC_MOUNT_ROOT

from trtfleet.api.basemodel import BaseModelSpec
from trtfleet_operator.builders.clibundle import cli_command, cli_init_container, cli_mount, cli_volume
from trtfleet_operator.builders.common import (
    ENGINES_VOLUME,
    Obj,
    container_security,
    env_from_secret,
    gpu_resources,
    metadata,
    pod_security,
    pull_secrets,
    pvc_volume,
    scheduling,
    shm_mount,
    shm_volume,
    sorted_env,
)
from trtfleet_operator.config import OperatorConfig
from trtfleet_operator.names import (
    ANNOTATION_ENGINE_HASH,
    COMPONENT_BUILD_PLAN,
    COMPONENT_ENGINE_BUILD,
    COMPONENT_ENGINE_RECORD,
    LABEL_BUILD_ATTEMPT,
    LABEL_ENGINE_HASH,
    build_job_name,
    engine_hash_label,
    engine_record_name,
    plan_configmap_name,
)

PLAN_KEY = "plan.json"
PLAN_MOUNT = "/plan"
BUILD_CONTAINER = "build"
TERMINATION_LOG = "/dev/termination-log"
SPEC_ERROR_EXIT_CODE = 2
"""``trtfleet engines build`` exits 2 when the spec cannot be built as written: retrying cannot help."""

RECORD_KEYS = ("hash", "uri", "image", "builtAt", "buildJob")


def _hash_labels(engine_hash: str, extra: Mapping[str, str] | None) -> dict[str, str]:
    return {LABEL_ENGINE_HASH: engine_hash_label(engine_hash), **(extra or {})}


def build_plan_configmap(
    engine_hash: str,
    plan_json: str,
    *,
    namespace: str,
    owners: Sequence[Mapping[str, Any]],
    labels: Mapping[str, str] | None = None,
) -> Obj:
    """The ConfigMap holding ``plan.json`` for the build Job of ``engine_hash``."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(
            plan_configmap_name(engine_hash),
            namespace,
            component=COMPONENT_BUILD_PLAN,
            labels=_hash_labels(engine_hash, labels),
            annotations={ANNOTATION_ENGINE_HASH: engine_hash},
            owners=owners,
        ),
        "data": {PLAN_KEY: plan_json},
    }


def source_claims(spec: BaseModelSpec, extra_uris: Sequence[str] = ()) -> list[str]:
    """PVCs the build reads ``pvc://`` sources from (mounted where the plan expects them)."""
    claims = set()
    for uri in (spec.source.uri, *extra_uris):
        parsed = urlparse(uri)
        if parsed.scheme == "pvc":
            claims.add(parsed.netloc)
    return sorted(claims)


def build_engine_job(
    spec: BaseModelSpec,
    *,
    engine_hash: str,
    namespace: str,
    owners: Sequence[Mapping[str, Any]],
    attempt: int,
    config: OperatorConfig,
    labels: Mapping[str, str] | None = None,
    merged_sources: Sequence[str] = (),
) -> Obj:
    """The Job that builds ``engine_hash`` from the plan ConfigMap into the engine PVC."""
    storage = config.storage
    container: Obj = {
        "name": BUILD_CONTAINER,
        "image": spec.engine.image,
        "imagePullPolicy": "IfNotPresent",
        "command": cli_command(
            "engines", "build", "--plan", f"{PLAN_MOUNT}/{PLAN_KEY}", "--out", f"{storage.engine_mount}/{engine_hash}"
        ),
        "env": sorted_env({"TRTFLEET_ENGINE_HASH": engine_hash}),
        "resources": gpu_resources(spec, gpus=True),
        "volumeMounts": [
            {"name": ENGINES_VOLUME, "mountPath": storage.engine_mount},
            {"name": "plan", "mountPath": PLAN_MOUNT, "readOnly": True},
            shm_mount(),
            cli_mount(),
        ],
        "securityContext": container_security(),
        "terminationMessagePath": TERMINATION_LOG,
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    secret = spec.source.secret_ref.name if spec.source.secret_ref else None
    if secret:
        container["envFrom"] = env_from_secret(secret)
    claims = source_claims(spec, merged_sources)
    container["volumeMounts"] += [
        {"name": f"source-{index}", "mountPath": f"{PVC_MOUNT_ROOT}/{claim}", "readOnly": True}
        for index, claim in enumerate(claims)
    ]
    container["volumeMounts"].append({"name": "work", "mountPath": DEFAULT_WORKDIR})
    volumes = [
        shm_volume(),
        pvc_volume(ENGINES_VOLUME, storage.engine_pvc),
        {"name": "plan", "configMap": {"name": plan_configmap_name(engine_hash)}},
        *(pvc_volume(f"source-{index}", claim, read_only=True) for index, claim in enumerate(claims)),
        {"name": "work", "emptyDir": {}},
        cli_volume(),
    ]
    return hash_keyed_job(
        spec,
        name=build_job_name(engine_hash, attempt),
        namespace=namespace,
        owners=owners,
        engine_hash=engine_hash,
        attempt=attempt,
        config=config,
        labels=labels,
        container=container,
        volumes=volumes,
        init_containers=(cli_init_container(config),),
    )


def hash_keyed_job(
    spec: BaseModelSpec,
    *,
    name: str,
    namespace: str,
    owners: Sequence[Mapping[str, Any]],
    engine_hash: str,
    attempt: int,
    config: OperatorConfig,
    labels: Mapping[str, str] | None,
    container: Obj,
    volumes: Sequence[Obj],
    non_root: bool = False,
    init_containers: Sequence[Obj] = (),
) -> Obj:
    """The Job around ``container`` shared by engine builds and ``pytorch`` prepares: hash labels and
    annotation, attempt label, owners, the build policy's limits, and exit code 2 (a spec error) failing
    the Job at once. ``non_root`` for trtfleet's own image (its user, and the volumes' group);
    ``init_containers``: the CLI copy of :mod:`.clibundle` for stock images."""
    pod_labels = _hash_labels(engine_hash, labels)
    job_labels = {**pod_labels, LABEL_BUILD_ATTEMPT: str(attempt)}
    annotations = {ANNOTATION_ENGINE_HASH: engine_hash}
    pod_spec: Obj = {
        "restartPolicy": "Never",
        "enableServiceLinks": False,
        "securityContext": pod_security(non_root=non_root),
        **scheduling(spec),
        **pull_secrets(config.image_pull_secrets),
        **({"initContainers": list(init_containers)} if init_containers else {}),
        "containers": [container],
        "volumes": list(volumes),
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata(
            name,
            namespace,
            component=COMPONENT_ENGINE_BUILD,
            labels=job_labels,
            annotations=annotations,
            owners=owners,
        ),
        "spec": {
            "backoffLimit": config.build.backoff_limit,
            "activeDeadlineSeconds": config.build.deadline_s,
            "podFailurePolicy": {
                "rules": [
                    {
                        "action": "FailJob",
                        "onExitCodes": {
                            "containerName": str(container["name"]),
                            "operator": "In",
                            "values": [SPEC_ERROR_EXIT_CODE],
                        },
                    },
                    {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
                ]
            },
            "template": {
                "metadata": {
                    "labels": {
                        **metadata("x", namespace, component=COMPONENT_ENGINE_BUILD)["labels"],
                        **pod_labels,
                    },
                    "annotations": annotations,
                },
                "spec": pod_spec,
            },
        },
    }


def build_engine_record(
    engine_hash: str,
    *,
    namespace: str,
    uri: str,
    image: str,
    built_at: str,
    build_job: str,
) -> Obj:
    """The record of a built engine (see the module docstring); no owners on purpose."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(
            engine_record_name(engine_hash),
            namespace,
            component=COMPONENT_ENGINE_RECORD,
            labels=_hash_labels(engine_hash, None),
            annotations={ANNOTATION_ENGINE_HASH: engine_hash},
        ),
        "data": {"hash": engine_hash, "uri": uri, "image": image, "builtAt": built_at, "buildJob": build_job},
    }
