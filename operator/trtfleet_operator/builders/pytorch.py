"""Objects of a ``runtime: pytorch`` BaseModel: the prepare Job, the LLM-API options ConfigMap and the
``trtllm-serve`` Deployment (its Service and PodDisruptionBudget are :mod:`.serving`'s).

* **Prepare Job** ``trtfleet-prepare-<hash16>``: ``python3 -m trtfleet_operator.jobs.prepare --plan
  /plan/plan.json``. It stages the HF checkpoint into the model cache (the engine PVC, mounted at
  :data:`~trtfleet_operator.planning.MODEL_CACHE_MOUNT`) under ``checkpoints/<prepare hash>/``: in
  trtfleet's own image (``images.trtfleet``, as its user) when that is all, and in ``images.modelopt``
  (a TensorRT-LLM image with ModelOpt's ``examples/llm_ptq``; trtfleet comes from the :mod:`.clibundle`
  init container) with the spec's GPUs when ``quantization.mode`` asks for ModelOpt. The Job envelope, its
  retries and its owners are the engine build's (:func:`.enginebuild.hash_keyed_job`).
* **Options ConfigMap** ``<serving>-llm-api-options``: the rendered ``llm-api-options.yaml``, labelled
  with its digest.
* **Deployment**: one container ``trtllm-serve`` running :func:`trtfleet_engines.pytorch.serving.serve_argv`
  on the staged checkpoint, ``/health`` startup / readiness / liveness probes, the options file, the model
  cache read-only at the same path as in the prepare Job, and the adapter volume read-only at
  ``storage.artifact_mount``, where the convert Job stages PEFT directories: every pod reads an adapter at
  the path the Adapter's ``status.artifact.path`` names. The pod template's spec hash covers the options,
  so any options change rolls the pods (``maxUnavailable: 0, maxSurge: 1``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from trtfleet_engines.plan import PVC_MOUNT_ROOT
from trtfleet_engines.pytorch.options import OPTIONS_FILE_NAME
from trtfleet_engines.pytorch.serving import SERVE_PORT, PreparePlan, probes, serve_argv

from trtfleet.api.basemodel import BaseModelSpec, QuantizationMode, ServingServer
from trtfleet_operator.builders.clibundle import cli_init_container, cli_mount, cli_python_module, cli_volume
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
    rollout_strategy,
    scheduling,
    serving_resources,
    shm_mount,
    shm_volume,
)
from trtfleet_operator.builders.convert import ARTIFACTS_VOLUME
from trtfleet_operator.builders.enginebuild import PLAN_KEY, PLAN_MOUNT, TERMINATION_LOG, hash_keyed_job, source_claims
from trtfleet_operator.builders.llmapi import APP_NAME as LLMAPI_APP_NAME
from trtfleet_operator.builders.llmapi import llmapi_containers, repository_volume
from trtfleet_operator.builders.serving import PRESTOP_SLEEP_S, STARTUP_BUDGET_S, TERMINATION_GRACE_S, selector_labels
from trtfleet_operator.config import OperatorConfig
from trtfleet_operator.names import (
    ANNOTATION_ENGINE_HASH,
    ANNOTATION_SPEC_HASH,
    COMPONENT_LLM_API_OPTIONS,
    COMPONENT_SERVING,
    LABEL_ENGINE_HASH,
    LABEL_INSTANCE,
    LABEL_NAME,
    LABEL_OPTIONS_HASH,
    LABEL_RUNTIME,
    digest,
    engine_hash_label,
    options_configmap_name,
    plan_configmap_name,
    prepare_job_name,
)
from trtfleet_operator.planning import MODEL_CACHE_MOUNT, EnginePlan

PREPARE_CONTAINER = "prepare"
PREPARE_MODULE = "trtfleet_operator.jobs.prepare"
SERVE_CONTAINER = "trtllm-serve"
OPTIONS_MOUNT = "/etc/trtfleet/llm-api"
PREPARE_CPU_RESOURCES: Obj = {"requests": {"cpu": "1", "memory": "4Gi"}, "limits": {"memory": "16Gi"}}
"""Staging copies files; a quantizing prepare gets the spec's GPUs instead (ModelOpt calibrates on GPU)."""
RUNTIME = "pytorch"


def _prepare_plan(plan: EnginePlan) -> PreparePlan:
    if plan.prepare is None or plan.options_yaml is None:
        raise ValueError("not a runtime pytorch plan: planning.plan_pytorch makes those")
    return plan.prepare


def build_prepare_job(
    spec: BaseModelSpec,
    plan: EnginePlan,
    *,
    namespace: str,
    owners: Sequence[Mapping[str, Any]],
    attempt: int,
    config: OperatorConfig,
    labels: Mapping[str, str] | None = None,
    merged_sources: Sequence[str] = (),
) -> Obj:
    """The Job that stages (and, when asked, merges an adapter into and quantizes) the checkpoint of
    ``plan.engine_hash``; ``merged_sources``: the merged adapter's URI, whose PVC it mounts as well."""
    _prepare_plan(plan)
    claims = source_claims(spec, merged_sources)
    quantizing = spec.quantization.mode is not QuantizationMode.NONE
    if quantizing and config.images.modelopt is None:
        raise ValueError("a quantizing prepare needs images.modelopt: reconcile_engine refuses it before")
    container: Obj = {
        "name": PREPARE_CONTAINER,
        "image": config.images.modelopt if quantizing else config.images.trtfleet,
        "imagePullPolicy": "IfNotPresent",
        "command": cli_python_module(PREPARE_MODULE) if quantizing else ["python3", "-m", PREPARE_MODULE],
        "args": ["--plan", f"{PLAN_MOUNT}/{PLAN_KEY}"],
        "resources": gpu_resources(spec, gpus=True) if quantizing else PREPARE_CPU_RESOURCES,
        "volumeMounts": [
            {"name": ENGINES_VOLUME, "mountPath": MODEL_CACHE_MOUNT},
            {"name": "plan", "mountPath": PLAN_MOUNT, "readOnly": True},
            shm_mount(),
            *(
                {"name": f"source-{index}", "mountPath": f"{PVC_MOUNT_ROOT}/{claim}", "readOnly": True}
                for index, claim in enumerate(claims)
            ),
            *([cli_mount()] if quantizing else []),
        ],
        "securityContext": container_security(),
        "terminationMessagePath": TERMINATION_LOG,
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    if spec.source.secret_ref is not None:
        container["envFrom"] = env_from_secret(spec.source.secret_ref.name)
    volumes = [
        shm_volume(),
        pvc_volume(ENGINES_VOLUME, config.storage.engine_pvc),
        {"name": "plan", "configMap": {"name": plan_configmap_name(plan.engine_hash)}},
        *(pvc_volume(f"source-{index}", claim, read_only=True) for index, claim in enumerate(claims)),
        *([cli_volume()] if quantizing else []),
    ]
    return hash_keyed_job(
        spec,
        name=prepare_job_name(plan.engine_hash, attempt),
        namespace=namespace,
        owners=owners,
        engine_hash=plan.engine_hash,
        attempt=attempt,
        config=config,
        labels={LABEL_RUNTIME: RUNTIME, **(labels or {})},
        container=container,
        volumes=volumes,
        non_root=not quantizing,
        init_containers=(cli_init_container(config),) if quantizing else (),
    )


def build_options_configmap(plan: EnginePlan, *, name: str, namespace: str, owner: Mapping[str, Any]) -> Obj:
    """The LLM-API options file of ``plan`` (``model.yaml`` for Triton's llmapi model), labelled with the digest
    of its text."""
    _prepare_plan(plan)
    text = str(plan.options_yaml)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(
            options_configmap_name(name),
            namespace,
            component=COMPONENT_LLM_API_OPTIONS,
            labels={LABEL_OPTIONS_HASH: digest(text, 16), LABEL_RUNTIME: RUNTIME},
            annotations={ANNOTATION_ENGINE_HASH: plan.engine_hash},
            owners=[owner],
        ),
        "data": {plan.options_file: text},
    }


def _serve_container(spec: BaseModelSpec, plan: EnginePlan, *, served_name: str, config: OperatorConfig) -> Obj:
    argv = serve_argv(
        checkpoint_dir=_prepare_plan(plan).serve_checkpoint_dir,
        options_path=f"{OPTIONS_MOUNT}/{OPTIONS_FILE_NAME}",
        served_model_name=served_name,
    )
    checks = probes(SERVE_PORT)
    container: Obj = {
        "name": SERVE_CONTAINER,
        "image": spec.engine.image,
        "imagePullPolicy": "IfNotPresent",
        "command": list(argv[:1]),
        "args": list(argv[1:]),
        "ports": [{"name": "http", "containerPort": SERVE_PORT, "protocol": "TCP"}],
        "startupProbe": checks.startup.to_kubernetes(),
        "readinessProbe": checks.readiness.to_kubernetes(),
        "livenessProbe": checks.liveness.to_kubernetes(),
        "volumeMounts": [
            {"name": ENGINES_VOLUME, "mountPath": MODEL_CACHE_MOUNT, "readOnly": True},
            {"name": "llm-api-options", "mountPath": OPTIONS_MOUNT, "readOnly": True},
            {"name": ARTIFACTS_VOLUME, "mountPath": config.storage.artifact_mount, "readOnly": True},
            shm_mount(),
        ],
        "lifecycle": {"preStop": {"sleep": {"seconds": PRESTOP_SLEEP_S}}},
        "securityContext": container_security(),
    }
    container["resources"] = serving_resources(spec)
    return container


def build_pytorch_deployment(
    spec: BaseModelSpec,
    plan: EnginePlan,
    *,
    name: str,
    namespace: str,
    owner: Mapping[str, Any],
    basemodel: str,
    options: Obj,
    config: OperatorConfig,
    adapter: str | None = None,
    served_name: str | None = None,
    variant: str | None = None,
    replicas: int | None = None,
) -> Obj:
    """The ``trtllm-serve`` Deployment of a ``pytorch`` BaseModel (served under the BaseModel's name), or with
    ``serving.server: triton`` the Triton one (:mod:`.llmapi`); with ``adapter``, a merged Adapter's (its
    checkpoint in ``plan``, served under ``served_name``); with ``variant``, a QLoRA base variant's (served under
    the BaseModel's name, adapters by ``lora_request`` as on the base); ``replicas``: default the spec's."""
    selector = selector_labels(basemodel, adapter, variant)
    triton = spec.serving.server_or_default is ServingServer.TRITON
    pod_labels = {
        **metadata("x", namespace, component=COMPONENT_SERVING)["labels"],
        **selector,
        LABEL_NAME: LLMAPI_APP_NAME if triton else "trtfleet-trtllm-serve",
        LABEL_INSTANCE: name,
        LABEL_ENGINE_HASH: engine_hash_label(plan.engine_hash),
        LABEL_RUNTIME: RUNTIME,
    }
    volumes: list[Obj] = [
        shm_volume(),
        pvc_volume(ENGINES_VOLUME, config.storage.engine_pvc, read_only=True),
        pvc_volume(ARTIFACTS_VOLUME, config.storage.artifact_pvc, read_only=True),
        {"name": "llm-api-options", "configMap": {"name": options["metadata"]["name"]}},
    ]
    pod_spec: Obj = {
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": TERMINATION_GRACE_S,
        "securityContext": pod_security(non_root=False),
        **scheduling(spec),
        **pull_secrets(config.image_pull_secrets),
    }
    if triton:
        init, container = llmapi_containers(
            spec, options_volume="llm-api-options", options_mount=OPTIONS_MOUNT, prestop_sleep_s=PRESTOP_SLEEP_S,
            config=config,
        )
        pod_spec["initContainers"] = [init]
        pod_spec["containers"] = [container]
        volumes.append(repository_volume())
    else:
        pod_spec["containers"] = [_serve_container(spec, plan, served_name=served_name or basemodel, config=config)]
    pod_spec["volumes"] = sorted(volumes, key=lambda v: str(v["name"]))
    template: Obj = {"metadata": {"labels": pod_labels}, "spec": pod_spec}
    spec_hash = digest({"template": template, "options": options["data"]}, 16)
    template["metadata"]["annotations"] = {ANNOTATION_SPEC_HASH: spec_hash, ANNOTATION_ENGINE_HASH: plan.engine_hash}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(
            name,
            namespace,
            component=COMPONENT_SERVING,
            labels={**selector, LABEL_RUNTIME: RUNTIME},
            annotations={ANNOTATION_ENGINE_HASH: plan.engine_hash, ANNOTATION_SPEC_HASH: spec_hash},
            owners=[owner],
        ),
        "spec": {
            "replicas": spec.serving.replicas if replicas is None else replicas,
            "revisionHistoryLimit": 3,
            "progressDeadlineSeconds": STARTUP_BUDGET_S + 600,
            "selector": {"matchLabels": selector},
            "strategy": rollout_strategy(spec),
            "template": template,
        },
    }
