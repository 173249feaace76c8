"""Triton with TRT-LLM's ``llmapi`` model: how a ``runtime: pytorch, serving.server: triton`` pod serves (pure).

TRT-LLM's only Triton model left after the TensorRT-engine flow's removal is the Python-backend model
``triton_backend/all_models/llmapi/tensorrt_llm`` (``config.pbtxt``, ``1/model.py``, ``1/helpers.py``,
``1/model.yaml``). The ``tritonserver:<yy.mm>-trtllm-python-py3`` images carry it at
:data:`TEMPLATE_DIR`. Its ``model.py`` passes every key of ``model.yaml`` except ``triton_config`` to
``LLM(**kwargs)``, and sets the model's ``max_batch_size`` and decoupled transaction policy from
``triton_config`` in ``auto_complete_config`` (so the server must **not** run with
``--disable-auto-complete-config``). Upstream files and commits: docs/design/pytorch-backend.md.

* :func:`build_llmapi_model_config` / :func:`render_llmapi_model_yaml`: the same LLM-API options trtfleet
  renders for ``trtllm-serve --config`` (:mod:`.options`), plus ``model`` (the staged checkpoint),
  ``backend: pytorch`` and ``triton_config: {max_batch_size: 0, decoupled: true}``: decoupled, because
  upstream refuses ``streaming`` otherwise ("Streaming is only supported in decoupled mode.").
* :func:`repository_script`: copy the image's template into an empty model repository and put the rendered
  ``model.yaml`` in its ``1/`` (works with every ``model.py`` version; newer ones also read
  ``LLM_CONFIG_PATH``).
* :func:`triton_argv`, :func:`llmapi_probes`: ``tritonserver`` on HTTP 8000, gRPC 8001, metrics 8002; probes on
  ``/v2/health/ready`` (startup: as long as a model load, :data:`~.serving.STARTUP_TIMEOUT_S`) and
  ``/v2/health/live``.
"""

from __future__ import annotations

import posixpath
import shlex
from typing import Any

import yaml

from trtfleet.api.basemodel import BaseModelSpec
from trtfleet_engines.pytorch.capacity import PytorchCapacityPlan
from trtfleet_engines.pytorch.options import build_llm_api_options
from trtfleet_engines.pytorch.serving import STARTUP_TIMEOUT_S, HttpProbe, ServingProbes

MODEL_NAME = "tensorrt_llm"
"""The llmapi model's name in its ``config.pbtxt``: what the router addresses."""
TEMPLATE_DIR = "/app/all_models/llmapi/tensorrt_llm"
"""Where the Triton TRT-LLM images keep the model (``cp -R /app/all_models/llmapi/ ...`` in upstream docs)."""
MODEL_YAML_NAME = "model.yaml"
HTTP_PORT = 8000
GRPC_PORT = 8001
METRICS_PORT = 8002
READY_PATH = "/v2/health/ready"
LIVE_PATH = "/v2/health/live"
HEADER = (
    "# TensorRT-LLM llmapi model.yaml (LLM() arguments + triton_config), rendered by trtfleet from the "
    "BaseModel spec.\n"
)
TRITON_CONFIG: dict[str, Any] = {"max_batch_size": 0, "decoupled": True}
"""``max_batch_size: 0``: the model takes one prompt per request (upstream's template value)."""


def build_llmapi_model_config(
    spec: BaseModelSpec, *, checkpoint_dir: str, capacity: PytorchCapacityPlan | None = None,
    draft_dir: str | None = None,
) -> dict[str, Any]:
    """``model.yaml`` as a dict: the trtllm-serve options of ``spec`` plus the model and ``triton_config``."""
    return {
        **build_llm_api_options(spec, capacity, draft_dir=draft_dir),
        "model": checkpoint_dir,
        "backend": "pytorch",
        "triton_config": dict(TRITON_CONFIG),
    }


def render_llmapi_model_yaml(
    spec: BaseModelSpec, *, checkpoint_dir: str, capacity: PytorchCapacityPlan | None = None,
    draft_dir: str | None = None,
) -> str:
    """The ``model.yaml`` text: a header comment, then block YAML with sorted keys (deterministic)."""
    config = build_llmapi_model_config(spec, checkpoint_dir=checkpoint_dir, capacity=capacity, draft_dir=draft_dir)
    return HEADER + yaml.safe_dump(config, sort_keys=True, default_flow_style=False)


def repository_script(*, repository_dir: str, model_yaml_path: str, template_dir: str = TEMPLATE_DIR) -> str:
    """Shell that assembles the model repository: the image's template, then our ``model.yaml`` in ``1/``."""
    model_dir = posixpath.join(repository_dir, MODEL_NAME)
    return "\n".join(
        [
            "set -eu",
            f"mkdir -p {shlex.quote(model_dir)}",
            f"cp -R {shlex.quote(template_dir.rstrip('/'))}/. {shlex.quote(model_dir)}/",
            f"cp {shlex.quote(model_yaml_path)} {shlex.quote(posixpath.join(model_dir, '1', MODEL_YAML_NAME))}",
        ]
    ) + "\n"


def triton_argv(*, repository_dir: str) -> tuple[str, ...]:
    """The serving container's command line (auto-complete stays on: the model sets its policy there)."""
    return (
        "tritonserver",
        f"--model-repository={repository_dir}",
        f"--http-port={HTTP_PORT}",
        f"--grpc-port={GRPC_PORT}",
        f"--metrics-port={METRICS_PORT}",
    )


def llmapi_probes() -> ServingProbes:
    """Startup and readiness on ``/v2/health/ready`` (every model loaded), liveness on ``/v2/health/live``."""
    startup_period_s = 10
    return ServingProbes(
        startup=HttpProbe(READY_PATH, HTTP_PORT, startup_period_s, 5, STARTUP_TIMEOUT_S // startup_period_s),
        readiness=HttpProbe(READY_PATH, HTTP_PORT, 5, 3, 2),
        liveness=HttpProbe(LIVE_PATH, HTTP_PORT, 10, 5, 6),
    )
