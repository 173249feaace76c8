"""The Gateway API CRDs in tests: GIE's InferencePool and Gateway API's HTTPRoute, where
``hack/install-gateway-crds.sh`` (``make tools``, or the first test that needs one) puts them; the InferencePool's
schema; installing them into a test control plane, and removing the InferencePool's again.

Each is its project's own file from its Go module (``sigs.k8s.io/gateway-api-inference-extension`` v1.6.2,
``sigs.k8s.io/gateway-api`` v1.6.1; versions and sha256 pinned in the script), not a copy kept here.
"""

from __future__ import annotations

import functools
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from tests.support.controlplane import ControlPlane, eventually

ROOT = Path(__file__).resolve().parents[2]
INSTALL_SCRIPT = ROOT / "hack" / "install-gateway-crds.sh"
INFERENCEPOOL_FILE = "gateway-api-inference-extension-v1.6.2/inference.networking.k8s.io_inferencepools.yaml"
HTTPROUTE_FILE = "gateway-api-v1.6.1/gateway.networking.k8s.io_httproutes.yaml"
CRD_NAME = "inferencepools.inference.networking.k8s.io"
HTTPROUTE_CRD_NAME = "httproutes.gateway.networking.k8s.io"
GROUP_VERSION_PATH = "/apis/inference.networking.k8s.io/v1"


def crd_path(file: str = INFERENCEPOOL_FILE) -> Path:
    """A fetched CRD file, fetched now (the script, as ``make tools`` runs it) when it is not there yet."""
    cache = Path(os.environ.get("TRTFLEET_CACHE") or Path.home() / ".cache" / "trtfleet")
    path = cache / "gateway-crds" / file
    if not path.is_file():
        fetched = subprocess.run(["bash", str(INSTALL_SCRIPT)], capture_output=True, text=True, check=False)
        if fetched.returncode != 0 or not path.is_file():
            raise FileNotFoundError(f"{path} is missing and {INSTALL_SCRIPT} could not fetch it: {fetched.stderr}")
    return path


@functools.cache
def inferencepool_schema() -> dict[str, Any]:
    """The ``openAPIV3Schema`` of the served version (v1)."""
    crd = yaml.safe_load(crd_path().read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


def _strict(schema: Any) -> Any:
    """``schema`` with unknown fields refused wherever it lists the fields (the API server prunes them)."""
    if isinstance(schema, dict):
        out = {key: _strict(value) for key, value in schema.items()}
        if "properties" in out and "additionalProperties" not in out:
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(item) for item in schema]
    return schema


def validate(obj: dict[str, Any]) -> None:
    """Raise ``jsonschema.ValidationError`` unless ``obj`` is an InferencePool GIE's CRD accepts (its OpenAPI
    schema, strict about unknown fields; its CEL rules are checked by a real API server, in the cluster tests)."""
    assert obj.get("apiVersion") == "inference.networking.k8s.io/v1" and obj.get("kind") == "InferencePool", obj
    jsonschema.validate(obj, _strict(inferencepool_schema()))


def served(cp: ControlPlane) -> bool:
    """Whether the API server's discovery lists InferencePools (what the operator asks too)."""
    result = cp.kubectl("get", "--raw", GROUP_VERSION_PATH, check=False)
    return result.returncode == 0 and '"inferencepools"' in result.stdout


def install(cp: ControlPlane) -> None:
    """Apply the CRD server-side and wait until InferencePools are served."""
    cp.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crd_path()))
    cp.wait_established(CRD_NAME)
    eventually(lambda: served(cp), timeout=30, what="InferencePools to be served")


def install_httproute(cp: ControlPlane) -> None:
    """Apply Gateway API's HTTPRoute CRD (standard channel) server-side and wait until HTTPRoutes are served."""
    cp.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crd_path(HTTPROUTE_FILE)))
    cp.wait_established(HTTPROUTE_CRD_NAME)
    eventually(lambda: cp.kubectl("get", "httproutes", "-A", check=False).returncode == 0, timeout=30,
               what="HTTPRoutes to be served")


def remove(cp: ControlPlane) -> None:
    """Delete the CRD (and with it every InferencePool) and wait until discovery no longer lists it."""
    cp.kubectl("delete", "crd", CRD_NAME, "--ignore-not-found", "--wait=true", "--timeout=60s")
    eventually(lambda: not served(cp), timeout=60, what="InferencePools to be no longer served")


@contextmanager
def installed(cp: ControlPlane) -> Iterator[ControlPlane]:
    """The InferencePool CRD served for the block, removed afterwards (other tests expect a cluster without it)."""
    install(cp)
    try:
        yield cp
    finally:
        remove(cp)
