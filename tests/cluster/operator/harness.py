"""Fixtures and helpers of the operator's cluster tests: the CRDs, ``trtfleet operator`` as a real
subprocess, and a stand-in kubelet that finishes Pods the way a node would (the control plane runs the
real Job and Deployment controllers; a kwok node runs Pods that have no nodeSelector)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from trtfleet_operator.kube import KubeClient, collection_path, object_path

from tests.support.controlplane import ControlPlane, eventually, free_port
from trtfleet.kube import KubeApi, KubeSource

ROOT = Path(__file__).resolve().parents[3]
CRD_DIR = ROOT / "crds"
TRTFLEET = Path(sys.executable).parent / "trtfleet"
MANUAL_POOL = "trtfleet.io/test-pool=manual"
"""Convert Jobs are pinned to a node label no node has, so the test finishes their Pods itself."""
IMAGES = {
    "TRTFLEET_IMAGE": "ghcr.io/trtfleet/trtfleet:test",
    "TRTFLEET_WORKER_IMAGE": "ghcr.io/trtfleet/reference-worker:test",
}

Obj = dict[str, Any]

BUILDS = "app.kubernetes.io/component=engine-build"
PREPARES = f"{BUILDS},trtfleet.io/runtime=pytorch"
CONVERTS = "app.kubernetes.io/component=adapter-convert"


@dataclass
class OperatorProcess:
    """``trtfleet operator --namespace NS`` with its log in a file; restartable."""

    cp: ControlPlane
    namespace: str
    log_dir: Path
    extra: Sequence[str] = ()
    env: dict[str, str] = field(default_factory=dict)
    """Overrides of the control plane's environment (``KUBECONFIG`` of another user, say)."""
    collect_artifacts: bool = False
    """Collect deleted Adapters' artifacts (off by default here: no kubelet runs the collect Jobs, so a
    deleted Ready Adapter would wait for one; the collection tests run them)."""
    proc: subprocess.Popen[bytes] | None = None
    health_port: int = 0
    metrics_port: int = 0
    starts: int = 0
    logs: list[Path] = field(default_factory=list)
    stopped_cpu_s: float = 0.0
    """CPU seconds of the processes already stopped (a performance figure to print, never to assert)."""

    def start(self) -> OperatorProcess:
        self.health_port, self.metrics_port = free_port(), free_port()
        self.starts += 1
        log = self.log_dir / f"operator-{self.starts}.log"
        self.logs.append(log)
        argv = [
            str(TRTFLEET),
            "operator",
            "--namespace",
            self.namespace,
            "--health-port",
            str(self.health_port),
            "--metrics-port",
            str(self.metrics_port),
            "--resync-interval",
            "3",
            "--build-backoff-limit",
            "0",
            "--build-retry-delay",
            "2",
            "--convert-node-selector",
            MANUAL_POOL,
            *([] if self.collect_artifacts else ["--no-artifact-collection"]),
            *self.extra,
        ]
        with log.open("wb") as out:
            env = {**self.cp.env, **IMAGES, **self.env}
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
        eventually(self._healthy, timeout=60, what="the operator's /healthz")
        return self

    def _healthy(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"operator exited with {self.proc.returncode}:\n{self.log_tail()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.health_port}/healthz", timeout=2) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    def _running_cpu_s(self) -> float:
        if self.proc is None or self.proc.poll() is not None:
            return 0.0
        try:  # utime and stime, fields 14 and 15 of /proc/PID/stat (after the parenthesised name)
            fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return 0.0
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def cpu_s(self) -> float:
        """CPU seconds the operator processes used so far (Linux; 0 elsewhere)."""
        return self.stopped_cpu_s + self._running_cpu_s()

    def stop(self, *, kill: bool = False) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.stopped_cpu_s += self._running_cpu_s()
        self.proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def restart(self, *, kill: bool = False) -> None:
        self.stop(kill=kill)
        self.start()

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as response:
            return str(response.read().decode())

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.logs[-1].read_text(errors="replace").splitlines()[-lines:]) if self.logs else ""


# ----------------------------------------------------------------------------------------- documents
def example(file_name: str) -> Obj:
    """One of the repository's ``examples/*.yaml`` documents."""
    return dict(yaml.safe_load((ROOT / "examples" / file_name).read_text()))


def llama_doc(ns: str, *, name: str = "llama3-8b", runtime: str | None = None, **spec: Any) -> Obj:
    """The llama3-8b example, scheduled on a GPU product label only this namespace's nodes carry; ``spec``
    entries are merged into the example's spec sections of the same name."""
    doc = example("basemodel-llama3-8b-tensorrtllm.yaml")
    doc["metadata"]["name"] = name
    if runtime is not None:
        doc["spec"]["runtime"] = runtime
    doc["spec"]["serving"]["nodeSelector"] = {"nvidia.com/gpu.product": f"H100-{ns}"}
    for key, value in spec.items():
        doc["spec"][key] = {**doc["spec"].get(key, {}), **value}
    return doc


def adapter_doc(name: str, base: str = "tiny", uri: str | None = None, **spec: Any) -> Obj:
    """An Adapter of ``base`` (its source ``uri`` defaults to a per-name local path); ``spec`` adds fields."""
    return {
        "apiVersion": "trtfleet.io/v1alpha1",
        "kind": "Adapter",
        "metadata": {"name": name},
        "spec": {"baseModel": base, "source": {"uri": uri or f"file:///opt/trtfleet/adapters/{name}"}, **spec},
    }


def apply_tiny(cp: ControlPlane, ns: str) -> None:
    """The reference-runtime ``tiny`` BaseModel example."""
    apply(cp, ns, (ROOT / "examples" / "basemodel-reference-tiny.yaml").read_text())


# --------------------------------------------------------------------------------------------- reads
def get(cp: ControlPlane, ns: str, kind: str, name: str) -> Obj | None:
    res = cp.kubectl("get", kind, name, "-n", ns, "-o", "json", check=False)
    return json.loads(res.stdout) if res.returncode == 0 else None


def items(cp: ControlPlane, ns: str, kind: str, selector: str | None = None) -> list[Obj]:
    args = ["get", kind, "-n", ns, "-o", "json"] + (["-l", selector] if selector else [])
    return list(json.loads(cp.kubectl(*args).stdout)["items"])


def live_jobs(cp: ControlPlane, ns: str, selector: str) -> list[Obj]:
    """The Jobs matching ``selector`` that are not being deleted."""
    return [j for j in items(cp, ns, "jobs", selector) if not j["metadata"].get("deletionTimestamp")]


def first_live_job(cp: ControlPlane, ns: str, selector: str, what: str, timeout: float = 30) -> Obj:
    """Wait for a live Job matching ``selector`` and return the first."""
    return dict(wait_until(lambda: (live_jobs(cp, ns, selector) or [None])[0], timeout, what))


def cond(obj: Obj | None, type_: str) -> Obj:
    for c in ((obj or {}).get("status") or {}).get("conditions") or []:
        if c["type"] == type_:
            return dict(c)
    return {}


def phase(obj: Obj | None) -> str | None:
    return ((obj or {}).get("status") or {}).get("phase")


def wait_phase(cp: ControlPlane, ns: str, kind: str, name: str, want: str, timeout: float = 60) -> Obj:
    def probe() -> Obj | None:
        obj = get(cp, ns, kind, name)
        return obj if phase(obj) == want else None

    try:
        return dict(eventually(probe, timeout=timeout, what=f"{kind}/{name} phase {want}"))
    except AssertionError as exc:
        raise AssertionError(f"{exc}; now: {json.dumps((get(cp, ns, kind, name) or {}).get('status'))}") from exc


def apply(cp: ControlPlane, ns: str, doc: str | Obj) -> None:
    """``kubectl apply`` of a YAML text or of one document."""
    cp.kubectl("apply", "-n", ns, "-f", "-", input=doc if isinstance(doc, str) else yaml.safe_dump(doc))


def patch(cp: ControlPlane, ns: str, kind: str, name: str, body: Obj, *, status: bool = False) -> None:
    args = ["patch", kind, name, "-n", ns, "--type=merge", "-p", json.dumps(body)]
    cp.kubectl(*(args + ["--subresource=status"] if status else args))


# ------------------------------------------------------------------------------------------- kubelet
def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def finished_pod_status(pod: Obj, container: str, *, exit_code: int, message: str = "") -> Obj:
    """The status a kubelet writes when ``container`` of a restartPolicy Never pod exits."""
    now = _now()
    terminated = {
        "exitCode": exit_code,
        "reason": "Completed" if exit_code == 0 else "Error",
        "startedAt": now,
        "finishedAt": now,
    }
    if message:
        terminated["message"] = message
    statuses = [
        {
            "name": c["name"],
            "image": c["image"],
            "imageID": "",
            "ready": False,
            "restartCount": 0,
            "state": {"terminated": terminated if c["name"] == container else {**terminated, "exitCode": 0}},
        }
        for c in pod["spec"]["containers"]
    ]
    return {
        "status": {
            "phase": "Succeeded" if exit_code == 0 else "Failed",
            "startTime": now,
            "containerStatuses": statuses,
        }
    }


def finish_job_pod(cp: ControlPlane, ns: str, job: str, container: str, *, exit_code: int, message: str = "") -> None:
    """Act as the kubelet: the (first unfinished) pod of Job ``job`` ends with ``exit_code``/``message``."""
    pod = eventually(
        lambda: next(
            (
                p
                for p in items(cp, ns, "pods", f"batch.kubernetes.io/job-name={job}")
                if p["status"].get("phase") in ("Pending", "Running")
            ),
            None,
        ),
        timeout=30,
        what=f"a pod of Job {job}",
    )
    patch(
        cp,
        ns,
        "pod",
        pod["metadata"]["name"],
        finished_pod_status(pod, container, exit_code=exit_code, message=message),
        status=True,
    )


class AsyncKube:
    """The operator's own client, for bulk work in tests (200 adapters); one session per call."""

    def __init__(self, cp: ControlPlane) -> None:
        self.source = KubeSource(kubeconfig=str(cp.kubeconfig))

    async def _client(self) -> KubeClient:
        return KubeClient(await KubeApi.connect(self.source), field_manager="trtfleet-tests")

    def list(self, ns: str, api_version: str, kind: str, selector: str | None = None) -> list[Obj]:
        async def run() -> list[Obj]:
            async with await self._client() as client:
                return await client.list(collection_path(api_version, kind, ns), label_selector=selector)

        return asyncio.run(run())

    def finish_pods(
        self, ns: str, pods: Sequence[Obj], container: str, messages: dict[str, str], concurrency: int = 16
    ) -> None:
        """Act as the kubelet for many pods at once: each ends with exit code 0 and its Job's message."""

        async def run() -> None:
            gate = asyncio.Semaphore(concurrency)
            async with await self._client() as client:

                async def one(pod: Obj) -> None:
                    job = pod["metadata"]["labels"]["batch.kubernetes.io/job-name"]
                    async with gate:
                        await client.patch_merge(
                            object_path("v1", "Pod", ns, pod["metadata"]["name"]),
                            finished_pod_status(pod, container, exit_code=0, message=messages[job]),
                            status=True,
                        )

                await asyncio.gather(*(one(p) for p in pods))

        asyncio.run(run())


def wait_until(probe: Any, timeout: float, what: str) -> Any:
    return eventually(probe, timeout=timeout, what=what)


def elapsed(start: float) -> float:
    return round(time.monotonic() - start, 1)


def volume_for(cp: ControlPlane, ns: str, claim: str, *, size: str = "10Gi", modes: Sequence[str] = ("ReadWriteMany",),
               storage_class: str = "") -> None:
    """A PersistentVolume reserved for PVC ``ns/claim`` (what a cluster's storage class would provision), so the
    claim binds and pods that mount it schedule (left Released when the test namespace goes)."""
    cp.kubectl("apply", "-f", "-", input=yaml.safe_dump({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": f"{ns}-{claim}", "labels": {"trtfleet.io/test-namespace": ns}},
        "spec": {"capacity": {"storage": size}, "accessModes": list(modes), "storageClassName": storage_class,
                 "persistentVolumeReclaimPolicy": "Retain", "hostPath": {"path": f"/tmp/{ns}/{claim}"},
                 "claimRef": {"namespace": ns, "name": claim}},
    }))


def bound_claims(cp: ControlPlane, ns: str, claims: Sequence[str]) -> None:
    """PVCs ``claims`` in ``ns`` (ReadWriteMany), each bound to a volume of its own."""
    for claim in claims:
        volume_for(cp, ns, claim)
        apply(cp, ns, {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": claim},
                       "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "",
                                "resources": {"requests": {"storage": "10Gi"}}}})
    for claim in claims:
        wait_until(lambda c=claim: (get(cp, ns, "pvc", c) or {}).get("status", {}).get("phase") == "Bound", 60,
                   f"PVC {claim} Bound")
