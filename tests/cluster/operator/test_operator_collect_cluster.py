"""Deleting an Adapter leaves no artifact: the operator drains it, a collect Job removes its directory, and only
then the Adapter goes (kopf's finalizer), against the real API server and Job controller.

The test plays the kubelet by running each Job's own container command here, with the adapter volume mapped to
a temporary directory (the convert Job writes the real artifact into it; the collect Job removes it), then
writes the pod's end into its status. An artifact another Adapter still uses is kept.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from trtfleet_operator.builders.enginebuild import build_engine_record
from trtfleet_operator.names import engine_record_name

from tests.cluster.operator.harness import (
    CONVERTS,
    ROOT,
    TRTFLEET,
    Obj,
    OperatorProcess,
    adapter_doc,
    apply,
    apply_tiny,
    finish_job_pod,
    first_live_job,
    get,
    live_jobs,
    wait_phase,
    wait_until,
)
from tests.support.controlplane import ControlPlane

pytestmark = pytest.mark.cluster

COLLECTS = "app.kubernetes.io/component=collect"
ASSETS = ROOT / "engines" / "trtfleet_engines" / "reference" / "assets" / "adapters"


@pytest.fixture
def collecting(crds: ControlPlane, kube_namespace: str, tmp_path: Path) -> Iterator[OperatorProcess]:
    process = OperatorProcess(crds, kube_namespace, tmp_path, extra=("--adapter-drain", "1"),
                              collect_artifacts=True).start()
    try:
        yield process
    finally:
        process.stop()


def run_job_here(job: Obj, mounts: dict[str, Path], tmp_path: Path) -> str:
    """Run the Job's container command on this machine, its mount paths (and file:///opt/trtfleet sources)
    mapped to local directories; return what it wrote as its termination message (or its stdout)."""
    container = job["spec"]["template"]["spec"]["containers"][0]
    termination = tmp_path / f"{job['metadata']['name']}.termination"

    def local(arg: str) -> str:
        arg = arg.replace("file:///opt/trtfleet/adapters", f"file://{ASSETS}")
        for mount, directory in mounts.items():
            if arg == mount or arg.startswith(mount + "/"):
                return str(directory) + arg[len(mount):]
        return arg

    argv = [local(a) for a in [*container["command"], *container.get("args", [])]]
    assert argv[0] == "python3"
    argv[0] = sys.executable
    if "trtfleet_operator.jobs.convert" in argv:
        argv += ["--termination-log", str(termination), "--trtfleet", str(TRTFLEET), "--work", str(tmp_path / "w")]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return termination.read_text() if termination.exists() else done.stdout


def convert_here(cp: ControlPlane, ns: str, volume: Path, tmp_path: Path, adapter: str) -> str:
    job = wait_until(lambda: next((j for j in live_jobs(cp, ns, CONVERTS)
                                   if j["metadata"]["labels"].get("trtfleet.io/adapter") == adapter), None),
                     30, f"the convert Job of {adapter}")
    message = run_job_here(job, {"/artifacts": volume}, tmp_path)
    finish_job_pod(cp, ns, job["metadata"]["name"], "convert", exit_code=0, message=message)
    ready = wait_phase(cp, ns, "adapter", adapter, "Ready", timeout=60)
    return str(ready["status"]["artifact"]["uri"])


def test_deleting_an_adapter_removes_its_artifact_unless_another_uses_it(
    collecting: OperatorProcess, tmp_path: Path
) -> None:
    cp, ns = collecting.cp, collecting.namespace
    volume = tmp_path / "adapter-volume"
    volume.mkdir()
    apply_tiny(cp, ns)
    apply(cp, ns, adapter_doc("upper", uri="file:///opt/trtfleet/adapters/upper"))
    uri = convert_here(cp, ns, volume, tmp_path, "upper")
    directory = volume / uri.removeprefix("pvc://trtfleet-adapters/")
    assert (directory / "manifest.json").is_file()

    # A second Adapter of the same source shares the artifact: deleting the first keeps it.
    apply(cp, ns, adapter_doc("upper-again", uri="file:///opt/trtfleet/adapters/upper"))
    assert convert_here(cp, ns, volume, tmp_path, "upper-again") == uri
    cp.kubectl("delete", "adapter", "upper", "-n", ns, "--wait=true", "--timeout=60s")
    assert live_jobs(cp, ns, COLLECTS) == [] and directory.is_dir()

    # The last user: the deletion waits for the collect Job, which removes the directory.
    cp.kubectl("delete", "adapter", "upper-again", "-n", ns, "--wait=false")
    job = first_live_job(cp, ns, COLLECTS, "the collect Job", timeout=60)
    assert get(cp, ns, "adapter", "upper-again") is not None, "held by the finalizer until the Job ends"
    message = run_job_here(job, {"/volume": volume}, tmp_path)
    assert not directory.exists()
    finish_job_pod(cp, ns, job["metadata"]["name"], "collect", exit_code=0, message=message)
    wait_until(lambda: get(cp, ns, "adapter", "upper-again") is None, 60, "the Adapter to go")
    assert list(volume.iterdir()) == [], "deleting the Adapters leaves no artifact"


def test_an_engine_nothing_uses_is_collected_after_its_retention(
    crds: ControlPlane, kube_namespace: str, tmp_path: Path
) -> None:
    """Two engine records: the one of the running BaseModel stays, the orphan is marked unused, then (retention 2 s)
    its record is deleted and a collect Job removes its directory from the engine volume."""
    cp, ns = crds, kube_namespace
    process = OperatorProcess(cp, ns, tmp_path, extra=("--engine-retention", "2", "--collect-interval", "1")).start()
    try:
        apply_tiny(cp, ns)
        used = wait_phase(cp, ns, "basemodel", "tiny", "Ready", timeout=90)["status"]["engine"]["hash"]
        orphan = "f" * 64
        for engine_hash in (used, orphan):
            apply(cp, ns, build_engine_record(engine_hash, namespace=ns, uri=f"pvc://trtfleet-engines/{engine_hash}",
                                              image="nvcr.io/nvidia/tritonserver:25.12-trtllm-python-py3",
                                              built_at="2026-11-21T12:00:00Z", build_job="trtfleet-build-x"))
        job = first_live_job(cp, ns, COLLECTS, "the collect Job of the orphan engine", timeout=60)
        assert job["spec"]["template"]["spec"]["containers"][0]["args"] == ["--remove", orphan]
        assert get(cp, ns, "configmap", engine_record_name(orphan)) is None, "the record goes first"
        kept = get(cp, ns, "configmap", engine_record_name(used))
        assert kept is not None and "trtfleet.io/unused-since" not in (kept["metadata"].get("annotations") or {})
    finally:
        process.stop()
