"""Fixtures of the operator's cluster tests (helpers live in harness.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.operator.autoscale_support import Router, router_process
from tests.cluster.operator.harness import CRD_DIR, OperatorProcess
from tests.support.controlplane import ControlPlane, eventually


@pytest.fixture(scope="module")
def crds(control_plane: ControlPlane) -> ControlPlane:
    """The trtfleet CRDs, Established and served."""
    control_plane.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD_DIR))
    control_plane.wait_established("basemodels.trtfleet.io", "adapters.trtfleet.io")
    for resource in ("basemodels", "adapters"):
        eventually(
            lambda r=resource: control_plane.kubectl("get", r, "-A", check=False).returncode == 0,
            timeout=30,
            what=f"{resource} served",
        )
    return control_plane


@pytest.fixture
def operator(crds: ControlPlane, kube_namespace: str, tmp_path: Path) -> Iterator[OperatorProcess]:
    process = OperatorProcess(crds, kube_namespace, tmp_path).start()
    try:
        yield process
    finally:
        process.stop()
        errors = [
            line for log in process.logs for line in log.read_text(errors="replace").splitlines() if "Traceback" in line
        ]
        assert not errors, f"the operator logged tracebacks:\n{process.log_tail(120)}"


@pytest.fixture
def router(tmp_path: Path) -> Iterator[Router]:
    """A ``trtfleet router`` process whose base model ``tiny`` has no pod yet (autoscaling tests)."""
    with router_process(tmp_path) as started:
        yield started
