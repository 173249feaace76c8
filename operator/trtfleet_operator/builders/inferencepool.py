"""The InferencePool of one BaseModel (Gateway API Inference Extension, ``inference.networking.k8s.io/v1``): the
backend a gateway's HTTPRoute names, whose endpoint picker is trtfleet's (``trtfleet router --epp-port``).

* ``selector``: every serving pod of the BaseModel, base, merged adapters and QLoRA base variants alike: the picker
  sends an adapter's requests to whichever serves it, and a gateway that checks the picked endpoint against the
  pool must find it there. Build and convert pods carry other components and stay out.
* ``targetPorts``: the one port the picker routes to, the pods' HTTP port (:func:`http_port`).
* ``endpointPickerRef``: the picker Service, in the pool's own namespace (the reference has no namespace field),
  and ``failureMode`` from ``spec.serving.gateway`` (GIE's default, FailClose, when unset).

Fields as GIE v1.6.2 defines them (``api/v1/inferencepool_types.go``); the pool is named like the BaseModel's
Service and owned by the BaseModel, so deleting the BaseModel deletes it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from trtfleet_engines.pytorch import llmapi
from trtfleet_engines.pytorch.serving import SERVE_PORT

from trtfleet.api.basemodel import BaseModelSpec, FailureMode, Runtime, ServingServer
from trtfleet_operator.builders.common import Obj, metadata
from trtfleet_operator.builders.serving import HTTP_PORT
from trtfleet_operator.config import InferencePoolConfig
from trtfleet_operator.names import (
    COMPONENT_INFERENCE_POOL,
    COMPONENT_SERVING,
    LABEL_BASEMODEL,
    LABEL_COMPONENT,
    label_value,
)

INFERENCE_POOL_API_VERSION: Final = "inference.networking.k8s.io/v1"
INFERENCE_POOL_KIND: Final = "InferencePool"
INFERENCE_POOL_PLURAL: Final = "inferencepools"


def http_port(spec: BaseModelSpec) -> int:
    """The serving container's HTTP port: Triton's (tensorrtllm, reference, pytorch with ``serving.server:
    triton``) or trtllm-serve's (pytorch)."""
    if spec.runtime is not Runtime.PYTORCH:
        return HTTP_PORT
    return llmapi.HTTP_PORT if spec.serving.server_or_default is ServingServer.TRITON else SERVE_PORT


def pool_selector(basemodel: str) -> dict[str, str]:
    """Labels every serving pod of ``basemodel`` carries, and only those (:mod:`trtfleet_operator.names`)."""
    return {LABEL_BASEMODEL: label_value(basemodel), LABEL_COMPONENT: COMPONENT_SERVING}


def failure_mode(spec: BaseModelSpec) -> FailureMode:
    gateway = spec.serving.gateway
    return gateway.failure_mode if gateway is not None else FailureMode.FAIL_CLOSE


def build_inference_pool(
    spec: BaseModelSpec,
    *,
    name: str,
    namespace: str,
    owner: Mapping[str, Any],
    basemodel: str,
    picker: InferencePoolConfig,
) -> Obj:
    """The BaseModel's InferencePool, its endpoint picker ``picker``'s Service of ``namespace``."""
    return {
        "apiVersion": INFERENCE_POOL_API_VERSION,
        "kind": INFERENCE_POOL_KIND,
        "metadata": metadata(
            name,
            namespace,
            component=COMPONENT_INFERENCE_POOL,
            labels={LABEL_BASEMODEL: label_value(basemodel)},
            owners=[owner],
        ),
        "spec": {
            "selector": {"matchLabels": pool_selector(basemodel)},
            "targetPorts": [{"number": http_port(spec)}],
            "appProtocol": "http",
            "endpointPickerRef": {
                "group": "",
                "kind": "Service",
                "name": picker.picker_service,
                "port": {"number": picker.picker_port},
                "failureMode": failure_mode(spec).value,
            },
        },
    }
