"""The ``trtfleet`` command in pods of NVIDIA's stock images: an init container and an emptyDir.

Engine-build Jobs and quantizing prepare Jobs run the TensorRT-LLM image a BaseModel names, whatever its
release. The init container ``trtfleet-cli`` (trtfleet's own image) copies the self-contained bundle
(:mod:`trtfleet.clibundle`: its own Python and trtfleet) into the emptyDir ``trtfleet-cli``; the job's
container mounts it read-only at :data:`CLI_MOUNT` and runs ``bin/trtfleet`` (or ``bin/trtfleet-python -m``)
from there. Serving pods need none of it: ``tritonserver`` and ``trtllm-serve`` are the image's own.
"""

from __future__ import annotations

from trtfleet.clibundle import BUNDLE_DIR, LAUNCHER, PYTHON_LAUNCHER
from trtfleet_operator.builders.common import Obj, container_security
from trtfleet_operator.config import OperatorConfig

CLI_VOLUME = "trtfleet-cli"
CLI_MOUNT = "/opt/trtfleet-cli"
CLI_INIT_CONTAINER = "trtfleet-cli"
CLI_COPY_RESOURCES: Obj = {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}}


def cli_command(*args: str) -> list[str]:
    """``trtfleet ARGS`` as a container command in a stock image."""
    return [f"{CLI_MOUNT}/{LAUNCHER}", *args]


def cli_python_module(module: str) -> list[str]:
    """``python -m MODULE`` with trtfleet's own Python, as a container command in a stock image."""
    return [f"{CLI_MOUNT}/{PYTHON_LAUNCHER}", "-m", module]


def cli_mount() -> Obj:
    return {"name": CLI_VOLUME, "mountPath": CLI_MOUNT, "readOnly": True}


def cli_volume() -> Obj:
    return {"name": CLI_VOLUME, "emptyDir": {}}


def cli_init_container(config: OperatorConfig) -> Obj:
    """Copies the bundle out of trtfleet's image into the pod's ``trtfleet-cli`` emptyDir."""
    return {
        "name": CLI_INIT_CONTAINER,
        "image": config.images.trtfleet,
        "imagePullPolicy": "IfNotPresent",
        "command": ["cp", "-a", f"{BUNDLE_DIR}/.", CLI_MOUNT],
        "resources": CLI_COPY_RESOURCES,
        "securityContext": container_security(),
        "volumeMounts": [{"name": CLI_VOLUME, "mountPath": CLI_MOUNT}],
    }
