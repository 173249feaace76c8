"""The serving containers of a ``runtime: pytorch`` BaseModel with ``serving.server: triton``: Triton running
TRT-LLM's Python-backend ``llmapi`` model (``tensorrt_llm``) instead of ``trtllm-serve``.

* Init container ``llmapi-repository`` (the serving image): copies the image's model template
  (:data:`trtfleet_engines.pytorch.llmapi.TEMPLATE_DIR`) into the emptyDir repository and puts the
  options ConfigMap's ``model.yaml`` (the LLM-API options plus ``model`` = the staged checkpoint and
  ``triton_config``) into its ``1/``.
* Container ``triton``: ``tritonserver --model-repository=/triton-repository`` with HTTP 8000, gRPC 8001 and
  metrics 8002 (named ports ``http``, ``grpc``, ``metrics``: the Service and the router find it like any
  Triton pod), probes on ``/v2/health/ready`` and ``/v2/health/live``, the model cache and the adapter
  volume read-only at the paths the prepare and convert Jobs wrote (the model reads an adapter from the
  ``lora_path`` input, as trtllm-serve does from ``lora_request.lora_path``).

:mod:`.pytorch` assembles the Deployment around them.
"""

from __future__ import annotations

from trtfleet_engines.pytorch.llmapi import (
    GRPC_PORT,
    HTTP_PORT,
    METRICS_PORT,
    MODEL_YAML_NAME,
    llmapi_probes,
    repository_script,
    triton_argv,
)

from trtfleet.api.basemodel import BaseModelSpec
from trtfleet_operator.builders.common import (
    ENGINES_VOLUME,
    Obj,
    container_security,
    serving_resources,
    shm_mount,
)
from trtfleet_operator.builders.convert import ARTIFACTS_VOLUME
from trtfleet_operator.config import OperatorConfig
from trtfleet_operator.planning import MODEL_CACHE_MOUNT

REPOSITORY_VOLUME = "triton-repository"
REPOSITORY_MOUNT = "/triton-repository"
INIT_CONTAINER = "llmapi-repository"
SERVE_CONTAINER = "triton"
APP_NAME = "trtfleet-triton-llmapi"
REPOSITORY_RESOURCES: Obj = {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}}


def repository_volume() -> Obj:
    return {"name": REPOSITORY_VOLUME, "emptyDir": {}}


def llmapi_containers(
    spec: BaseModelSpec, *, options_volume: str, options_mount: str, prestop_sleep_s: int, config: OperatorConfig
) -> tuple[Obj, Obj]:
    """(the init container that assembles the repository, the ``tritonserver`` container)."""
    image = spec.engine.image
    options = {"name": options_volume, "mountPath": options_mount, "readOnly": True}
    init: Obj = {
        "name": INIT_CONTAINER,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["sh", "-c"],
        "args": [
            repository_script(repository_dir=REPOSITORY_MOUNT, model_yaml_path=f"{options_mount}/{MODEL_YAML_NAME}")
        ],
        "resources": REPOSITORY_RESOURCES,
        "volumeMounts": [options, {"name": REPOSITORY_VOLUME, "mountPath": REPOSITORY_MOUNT}],
        "securityContext": container_security(),
    }
    argv = triton_argv(repository_dir=REPOSITORY_MOUNT)
    checks = llmapi_probes()
    container: Obj = {
        "name": SERVE_CONTAINER,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": list(argv[:1]),
        "args": list(argv[1:]),
        "ports": [
            {"name": "http", "containerPort": HTTP_PORT, "protocol": "TCP"},
            {"name": "grpc", "containerPort": GRPC_PORT, "protocol": "TCP"},
            {"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"},
        ],
        "startupProbe": checks.startup.to_kubernetes(),
        "readinessProbe": checks.readiness.to_kubernetes(),
        "livenessProbe": checks.liveness.to_kubernetes(),
        "volumeMounts": [
            {"name": ENGINES_VOLUME, "mountPath": MODEL_CACHE_MOUNT, "readOnly": True},
            {"name": REPOSITORY_VOLUME, "mountPath": REPOSITORY_MOUNT, "readOnly": True},
            {"name": ARTIFACTS_VOLUME, "mountPath": config.storage.artifact_mount, "readOnly": True},
            shm_mount(),
        ],
        "lifecycle": {"preStop": {"sleep": {"seconds": prestop_sleep_s}}},
        "securityContext": container_security(),
    }
    container["resources"] = serving_resources(spec)
    return init, container
