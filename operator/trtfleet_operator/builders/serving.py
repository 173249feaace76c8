"""Serving objects of one engine: the model-repository ConfigMap, the Triton Deployment, its headless
Service and its PodDisruptionBudget (the Service and PDB serve ``runtime: pytorch`` too, whose
Deployment and options are :mod:`trtfleet_operator.builders.pytorch`'s).

``runtime: tensorrtllm`` pods run ``tritonserver`` from the engine image. An init container assembles
the model repository in an emptyDir: the five ``config.pbtxt`` files rendered by
:func:`trtfleet_engines.triton.render_configs` from the spec (served through the ConfigMap, so serving
knobs need no rebuild) plus the python models' ``model.py`` from the image's TRT-LLM backend
(``OperatorConfig.trtllm_models_dir``). The engine's directory in the engine PVC (``<hash>/``, with
``engine/`` and ``tokenizer/``) is mounted read-only where the build plan rendered it to be served from
(:data:`trtfleet_engines.plan.SERVE_ARTIFACT_DIR`).

``runtime: reference`` pods run ``trtfleet worker`` from the reference-worker image, with the BaseModel
spec in the same ConfigMap (``basemodel.json``); the worker renders its own repository.

The pod template carries ``trtfleet.io/spec-hash``: a digest of the template and the ConfigMap data, so
any change of engine, image or serving knob (but not ``replicas``) rolls the pods, one surge pod at a time
and never below the desired count (``maxUnavailable: 0, maxSurge: 1``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from trtfleet_engines.plan import ENGINE_SUBDIR, SERVE_ARTIFACT_DIR
from trtfleet_engines.reference.threads import BLAS_THREADS_ENV
from trtfleet_engines.triton import render_configs

from trtfleet.api.basemodel import BaseModelSpec, Runtime
from trtfleet_operator.builders.common import (
    ENGINES_VOLUME,
    Obj,
    container_security,
    metadata,
    pod_security,
    pull_secrets,
    pvc_volume,
    rollout_strategy,
    scheduling,
    serving_resources,
    shm_mount,
    shm_volume,
    sorted_env,
)
from trtfleet_operator.config import OperatorConfig
from trtfleet_operator.names import (
    ANNOTATION_ENGINE_HASH,
    ANNOTATION_SPEC_HASH,
    COMPONENT_MODEL_REPO,
    COMPONENT_SERVING,
    LABEL_ADAPTER,
    LABEL_BASEMODEL,
    LABEL_ENGINE_HASH,
    LABEL_INSTANCE,
    LABEL_NAME,
    LABEL_ROLE,
    LABEL_RUNTIME,
    LABEL_VARIANT,
    ROLE_BASE,
    ROLE_MERGED,
    ROLE_VARIANT,
    digest,
    engine_hash_label,
    label_value,
    model_repo_configmap_name,
)

HTTP_PORT = 8000
GRPC_PORT = 8001
METRICS_PORT = 8002
MODEL_REPO_MOUNT = "/model-repo"
MODEL_CONFIG_MOUNT = "/etc/trtfleet/model-config"
SPEC_KEY = "basemodel.json"
SPEC_NOT_FOR_PODS: Final[dict[str, Any]] = {"autoscaling": True, "serving": {"replicas", "gateway"}}
"""Left out of ``basemodel.json``: what sizes the fleet or fronts it, not what a pod serves."""
STARTUP_BUDGET_S = 1800
"""How long a pod may take to load its engine before the kubelet restarts it (large engines take minutes)."""
STARTUP_PERIOD_S = 10
TERMINATION_GRACE_S = 60
"""In-flight generations get this long to finish after SIGTERM."""
PRESTOP_SLEEP_S = 10
"""Endpoints (and the router) drop a terminating pod before Triton stops accepting requests."""
PYTHON_BACKEND_MARK = 'backend: "python"'


def selector_labels(basemodel: str, adapter: str | None = None, variant: str | None = None) -> dict[str, str]:
    """The Deployment selector: base pods, each merged adapter's pods and each QLoRA base variant's pods
    never overlap."""
    role = ROLE_VARIANT if variant is not None else ROLE_BASE if adapter is None else ROLE_MERGED
    labels = {LABEL_BASEMODEL: label_value(basemodel), LABEL_ROLE: role}
    if adapter is not None:
        labels[LABEL_ADAPTER] = label_value(adapter)
    if variant is not None:
        labels[LABEL_VARIANT] = label_value(variant)
    return labels


def _is_reference(spec: BaseModelSpec) -> bool:
    return spec.runtime is Runtime.REFERENCE


def reference_model_dir(spec: BaseModelSpec) -> str:
    """The reference engine's model directory: the ``file://`` path of ``spec.source.uri``."""
    return file_path(spec.source.uri)


def file_path(uri: str) -> str:
    """The path of a ``file://`` URI (the reference images bake models and adapters in); others as given."""
    return uri[len("file://") :] if uri.startswith("file://") else uri


def reference_merged_args(adapter_uri: str, served_name: str) -> list[str]:
    """``trtfleet worker`` flags of a merged Adapter on the reference runtime: the worker merges at start."""
    return ["--merged-adapter", file_path(adapter_uri), "--merged-adapter-name", served_name]


def reference_variant_args(quantization: str) -> list[str]:
    """``trtfleet worker`` flags of a QLoRA base variant on the reference runtime: it dequantizes at start."""
    return ["--base-quantization", quantization]


def build_model_repo_configmap(
    spec: BaseModelSpec,
    *,
    name: str,
    namespace: str,
    owner: Mapping[str, Any],
    engine_hash: str,
    config: OperatorConfig,
    labels: Mapping[str, str] | None = None,
) -> Obj:
    """``<model>.pbtxt`` for each Triton model (tensorrtllm), or ``basemodel.json`` (reference)."""
    if _is_reference(spec):
        # not the pod count nor its sizing: every autoscaling decision would change the spec hash and roll the pods
        data = {SPEC_KEY: spec.model_dump_json(by_alias=True, exclude_none=True, exclude=SPEC_NOT_FOR_PODS)}
    else:
        engine_dir = f"{SERVE_ARTIFACT_DIR}/{ENGINE_SUBDIR}"
        data = {f"{model}.pbtxt": text for model, text in sorted(render_configs(spec, engine_dir).items())}
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(
            model_repo_configmap_name(name),
            namespace,
            component=COMPONENT_MODEL_REPO,
            labels=labels,
            annotations={ANNOTATION_ENGINE_HASH: engine_hash},
            owners=[owner],
        ),
        "data": data,
    }


def _assemble_script(model_repo: Obj, models_dir: str) -> str:
    """Shell that builds the model repository from the ConfigMap and the image's python models."""
    lines = ["set -eu"]
    for key, text in sorted(model_repo["data"].items()):
        model = key.removesuffix(".pbtxt")
        lines.append(f"mkdir -p {MODEL_REPO_MOUNT}/{model}/1")
        lines.append(f"cp {MODEL_CONFIG_MOUNT}/{key} {MODEL_REPO_MOUNT}/{model}/config.pbtxt")
        if PYTHON_BACKEND_MARK in text:
            lines.append(f"cp {models_dir}/{model}/1/model.py {MODEL_REPO_MOUNT}/{model}/1/model.py")
    return "\n".join(lines) + "\n"


def _triton_args(world_size: int) -> list[str]:
    common = [f"--model-repository={MODEL_REPO_MOUNT}", "--disable-auto-complete-config"]
    ports = [f"--http-port={HTTP_PORT}", f"--grpc-port={GRPC_PORT}", f"--metrics-port={METRICS_PORT}"]
    if world_size == 1:
        return ["tritonserver", *common, *ports]
    # TRT-LLM leader mode: rank 0 serves, every other rank loads only the engine (as TRT-LLM's
    # launch_triton_server.py does).
    argv = ["mpirun", "--allow-run-as-root"]
    for rank in range(world_size):
        if rank:
            argv.append(":")
        argv += [
            "-n",
            "1",
            "tritonserver",
            *common,
            f"--backend-config=python,shm-region-prefix-name=prefix{rank}_",
        ]
        argv += (
            ports
            if rank == 0
            else [
                "--model-control-mode=explicit",
                "--load-model=tensorrt_llm",
                "--allow-http=false",
                "--allow-grpc=false",
                "--allow-metrics=false",
            ]
        )
    return argv


def _probe(path: str, *, period_s: int, failures: int, timeout_s: int) -> Obj:
    return {
        "httpGet": {"path": path, "port": "http"},
        "periodSeconds": period_s,
        "failureThreshold": failures,
        "timeoutSeconds": timeout_s,
    }


def _ports() -> list[Obj]:
    return [
        {"name": "http", "containerPort": HTTP_PORT, "protocol": "TCP"},
        {"name": "grpc", "containerPort": GRPC_PORT, "protocol": "TCP"},
        {"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"},
    ]


def _server_container(
    spec: BaseModelSpec, *, engine_hash: str, config: OperatorConfig, extra_args: tuple[str, ...] = ()
) -> Obj:
    reference = _is_reference(spec)
    container: Obj = {"name": "triton", "imagePullPolicy": "IfNotPresent", "ports": _ports()}
    mounts = [{"name": "model-config", "mountPath": MODEL_CONFIG_MOUNT, "readOnly": True}, shm_mount()]
    if reference:
        container["image"] = config.images.worker
        container["command"] = ["trtfleet", "worker"]
        container["args"] = [
            "--spec",
            f"{MODEL_CONFIG_MOUNT}/{SPEC_KEY}",
            "--model-dir",
            reference_model_dir(spec),
            "--host",
            "0.0.0.0",
            "--http-port",
            str(HTTP_PORT),
            "--grpc-port",
            str(GRPC_PORT),
            "--metrics-port",
            str(METRICS_PORT),
            *extra_args,
        ]
        container["env"] = sorted_env(BLAS_THREADS_ENV)  # numpy reads it at import (reference/threads.py)
    else:
        world_size = spec.parallelism.tensor * spec.parallelism.pipeline
        container["image"] = spec.engine.image
        argv = _triton_args(world_size)
        container["command"], container["args"] = argv[:1], argv[1:]
        mounts = [
            {
                "name": ENGINES_VOLUME,
                "mountPath": SERVE_ARTIFACT_DIR,
                "subPath": engine_hash,
                "readOnly": True,
            },
            {"name": "model-repo", "mountPath": MODEL_REPO_MOUNT, "readOnly": True},
            shm_mount(),
        ]
    resources = {} if reference else serving_resources(spec)
    if resources:
        container["resources"] = resources
    container["volumeMounts"] = mounts
    container["startupProbe"] = _probe(
        "/v2/health/ready",
        period_s=STARTUP_PERIOD_S,
        failures=STARTUP_BUDGET_S // STARTUP_PERIOD_S,
        timeout_s=5,
    )
    container["readinessProbe"] = _probe("/v2/health/ready", period_s=5, failures=3, timeout_s=3)
    container["livenessProbe"] = _probe("/v2/health/live", period_s=10, failures=6, timeout_s=5)
    container["lifecycle"] = {"preStop": {"sleep": {"seconds": PRESTOP_SLEEP_S}}}
    container["securityContext"] = container_security()
    return container


def build_deployment(
    spec: BaseModelSpec,
    *,
    name: str,
    namespace: str,
    owner: Mapping[str, Any],
    basemodel: str,
    engine_hash: str,
    model_repo: Obj,
    config: OperatorConfig,
    adapter: str | None = None,
    worker_args: tuple[str, ...] = (),
    variant: str | None = None,
    replicas: int | None = None,
) -> Obj:
    """The Triton Deployment serving ``engine_hash`` (a base model, one merged adapter, or with ``variant`` a
    QLoRA base variant); ``worker_args``: extra ``trtfleet worker`` flags of the reference runtime
    (:func:`reference_merged_args`, :func:`reference_variant_args`); ``replicas``: default the spec's."""
    selector = selector_labels(basemodel, adapter, variant)
    runtime = spec.runtime.value
    pod_labels = {
        **metadata("x", namespace, component=COMPONENT_SERVING)["labels"],
        **selector,
        LABEL_NAME: "trtfleet-triton",
        LABEL_INSTANCE: name,
        LABEL_ENGINE_HASH: engine_hash_label(engine_hash),
        LABEL_RUNTIME: runtime,
    }
    reference = _is_reference(spec)
    volumes: list[Obj] = [
        shm_volume(),
        {"name": "model-config", "configMap": {"name": model_repo["metadata"]["name"]}},
    ]
    pod_spec: Obj = {
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": TERMINATION_GRACE_S,
        "securityContext": pod_security(non_root=reference),
        **scheduling(spec),
        **pull_secrets(config.image_pull_secrets),
    }
    if not reference:
        volumes += [
            pvc_volume(ENGINES_VOLUME, config.storage.engine_pvc, read_only=True),
            {"name": "model-repo", "emptyDir": {}},
        ]
        pod_spec["initContainers"] = [
            {
                "name": "model-repo",
                "image": spec.engine.image,
                "imagePullPolicy": "IfNotPresent",
                "command": ["/bin/sh", "-c", _assemble_script(model_repo, config.trtllm_models_dir)],
                "securityContext": container_security(),
                "volumeMounts": [
                    {"name": "model-config", "mountPath": MODEL_CONFIG_MOUNT, "readOnly": True},
                    {"name": "model-repo", "mountPath": MODEL_REPO_MOUNT},
                ],
            }
        ]
    pod_spec["containers"] = [_server_container(spec, engine_hash=engine_hash, config=config, extra_args=worker_args)]
    pod_spec["volumes"] = sorted(volumes, key=lambda v: str(v["name"]))
    template: Obj = {"metadata": {"labels": pod_labels}, "spec": pod_spec}
    spec_hash = digest({"template": template, "modelRepo": model_repo["data"]}, 16)
    template["metadata"]["annotations"] = {
        ANNOTATION_SPEC_HASH: spec_hash,
        ANNOTATION_ENGINE_HASH: engine_hash,
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(
            name,
            namespace,
            component=COMPONENT_SERVING,
            labels={**selector, LABEL_RUNTIME: runtime},
            annotations={ANNOTATION_ENGINE_HASH: engine_hash, ANNOTATION_SPEC_HASH: spec_hash},
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
