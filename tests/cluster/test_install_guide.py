"""docs/install-gpu.md, run as written: the guide is a test.

The guide's fenced blocks tagged ``guide:pytorch`` and ``guide:tensorrtllm`` are extracted and run in order by
bash (one environment carried from block to block, so ``export REGISTRY=...`` holds), from the repository root,
with the real kubectl and helm on the PATH, against a control plane of its own: kube-apiserver, controller
manager, scheduler and kwok with a simulated GPU node (``nvidia.com/gpu`` 8, ``nvidia.com/gpu.product:
NVIDIA-H100-80GB-HBM3``). Blocks tagged ``guide:manual`` (registry pushes, port-forwards) are the only ones not run;
the test checks that they are few and only of those kinds.

What a GPU cluster would do and this one cannot is played here, and only that:

* **storage**: a PersistentVolume per claim of the guide's namespaces, of the examples' class ``rwx``, stands for a
  ReadWriteMany provisioner;
* **the operator pod**: kwok runs no image, so after each ``helm install`` block the operator runs here as a
  process with the arguments and environment of the chart's Deployment, authenticated as its ServiceAccount (the
  chart's RBAC is what it gets);
* **Job pods** (prepare, build, convert: TensorRT-LLM and GPUs): a stand-in kubelet ends each scheduled Job pod
  with exit 0 and the termination message the real job writes (an artifact summary for convert Jobs). Serving
  pods are kwok's: Running and Ready without loading a model.

Each block gets a time limit, so a guide edit that breaks a step fails here instead of waiting out a
``kubectl wait --timeout=90m``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from trtfleet_operator.artifacts import ArtifactSummary

from tests.cluster.helm_release import Release, container, env_of, operator_argv, service_account_kubeconfig
from tests.cluster.operator.harness import finished_pod_status, volume_for
from tests.support.controlplane import ControlPlane, eventually, free_port
from tests.support.helm import ROOT, helm_binary

pytestmark = pytest.mark.cluster

GUIDE = ROOT / "docs" / "install-gpu.md"
BLOCK = re.compile(r"^```(\w+) guide:([\w-]+)\n(.*?)^```", re.M | re.S)
BLOCK_TIMEOUT_S = 240
GPU_PRODUCT = "NVIDIA-H100-80GB-HBM3"
MANUAL_KINDS = ("make images", "docker push", "port-forward")
SUMMARY = ArtifactSummary(16, ("attn_q", "attn_v"), "c0" * 32, 65536, "float16").to_json()
"""What the convert Job of examples/adapter-llama3-sql.yaml would report (a rank-16 PEFT adapter)."""


@dataclass(frozen=True)
class Block:
    language: str
    tag: str
    text: str


def guide_blocks() -> list[Block]:
    return [Block(lang, tag, text) for lang, tag, text in BLOCK.findall(GUIDE.read_text())]


class Shell:
    """Runs blocks in bash one after another, the environment carried over in a file."""

    def __init__(self, cp: ControlPlane, home: Path) -> None:
        self.state = home / "env.sh"
        self.state.write_text("")
        self.env = {
            **cp.env,
            "PATH": os.pathsep.join([str(Path(sys.executable).parent), str(helm_binary().parent), "/usr/bin", "/bin"]),
            "HELM_CACHE_HOME": str(home / "helm-cache"), "HELM_CONFIG_HOME": str(home / "helm-config"),
            "HELM_DATA_HOME": str(home / "helm-data"), "HOME": str(home),
        }

    def run(self, block: Block) -> str:
        script = f"source {self.state}\nset -euo pipefail\n{block.text}\nexport -p > {self.state}\n"
        done = subprocess.run(["bash", "-c", script], cwd=ROOT, env=self.env, capture_output=True, text=True,
                              timeout=BLOCK_TIMEOUT_S)
        assert done.returncode == 0, f"guide block failed ({block.tag}):\n{block.text}\n{done.stdout}\n{done.stderr}"
        return done.stdout


class Kubelet:
    """Ends the scheduled pods of the guide's Jobs as a GPU node would (see the module docstring)."""

    def __init__(self, cp: ControlPlane, namespaces: tuple[str, ...]) -> None:
        self.cp, self.namespaces = cp, namespaces
        self.stop = threading.Event()
        self.ended: list[str] = []
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self.stop.wait(0.5):
            for ns in self.namespaces:
                res = self.cp.kubectl("get", "pods", "-n", ns, "-l", "batch.kubernetes.io/job-name", "-o", "json",
                                      check=False)
                if res.returncode != 0:
                    continue
                for pod in json.loads(res.stdout)["items"]:
                    if pod["spec"].get("nodeName") and pod["status"].get("phase") in ("Pending", "Running"):
                        component = pod["metadata"]["labels"].get("app.kubernetes.io/component")
                        message = SUMMARY if component == "adapter-convert" else ""
                        name = pod["spec"]["containers"][0]["name"]
                        body = finished_pod_status(pod, name, exit_code=0, message=message)
                        self.cp.kubectl("patch", "pod", pod["metadata"]["name"], "-n", ns, "--subresource=status",
                                        "--type=merge", "-p", json.dumps(body), check=False)
                        self.ended.append(f"{ns}/{pod['metadata']['name']}")


class ChartOperator:
    """The operator of a release, as its Deployment runs it, authenticated as its ServiceAccount."""

    def __init__(self, cp: ControlPlane, release: str, namespace: str, home: Path) -> None:
        deployment = json.loads(cp.kubectl("get", "deployment", f"{release}-operator", "-n", namespace,
                                           "-o", "json").stdout)
        c = container(deployment)
        watched = [a.split("=", 1)[1] for a in c["args"] if a.startswith("--namespace=")]
        kubeconfig = service_account_kubeconfig(Release(cp, release, namespace, home), f"{release}-operator",
                                                home / f"{release}.kubeconfig")
        self.health = free_port()
        self.log = home / f"{release}-operator.log"
        env = {**cp.env, **env_of(c), "KUBECONFIG": str(kubeconfig)}
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(operator_argv(c["args"], watched[0], self.health), env=env, stdout=out,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        eventually(self._healthy, timeout=60, what=f"the {release} operator's /healthz")

    def _healthy(self) -> bool:
        assert self.proc.poll() is None, f"the operator exited:\n{self.log.read_text()[-4000:]}"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.health}/healthz", timeout=2) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture(scope="module")
def gpu_cluster() -> Iterator[ControlPlane]:
    """A control plane of the guide's own (it uses fixed namespace and release names), whose kwok leaves Job pods
    to the test, with one GPU node and ReadWriteMany volumes for the guide's claims."""
    cp = ControlPlane(kwok=True, kwok_completes_jobs=False)
    cp.start()
    try:
        cp.add_node("gpu-node-0", gpus=8, labels={"nvidia.com/gpu.product": GPU_PRODUCT})
        for ns in ("models", "llm-legacy"):
            for claim in ("trtfleet-engines", "trtfleet-adapters"):
                volume_for(cp, ns, claim, size="500Gi", storage_class="rwx")
        yield cp
    finally:
        cp.stop()


def test_guide_blocks_are_marked_and_manual_only_where_nothing_can_run() -> None:
    blocks = guide_blocks()
    tags = {b.tag for b in blocks}
    assert tags == {"pytorch", "tensorrtllm", "manual"}, tags
    assert sum(b.tag == "pytorch" for b in blocks) >= 8 and sum(b.tag == "tensorrtllm" for b in blocks) >= 3
    for block in blocks:
        assert block.language == "bash", block
        if block.tag == "manual":
            assert all(any(kind in line for kind in MANUAL_KINDS) or not line.strip() or line.startswith(" ")
                       or line.startswith("curl ") for line in block.text.splitlines()), block.text


def test_install_on_gpus_as_written(gpu_cluster: ControlPlane, tmp_path: Path) -> None:
    cp = gpu_cluster
    shell = Shell(cp, tmp_path)
    kubelet = Kubelet(cp, ("models", "llm-legacy"))
    kubelet.thread.start()
    operators: list[ChartOperator] = []
    try:
        for runtime, namespace, release in (("pytorch", "models", "trtfleet"),
                                            ("tensorrtllm", "llm-legacy", "trtfleet-legacy")):
            for block in (b for b in guide_blocks() if b.tag == runtime):
                shell.run(block)
                if "helm install" in block.text:  # kwok runs no image: the release's operator runs here
                    operators.append(ChartOperator(cp, release, block_namespace(block.text), tmp_path))
            check_ready(cp, namespace, runtime)
    finally:
        kubelet.stop.set()
        kubelet.thread.join(10)
        for operator in operators:
            operator.stop()
    logs = "".join(o.log.read_text() for o in operators)
    forbidden = [line for line in logs.splitlines() if "Forbidden" in line or " 403" in line]
    assert not forbidden, "the chart's RBAC refused the operator:\n" + "\n".join(forbidden[:10])
    assert "Traceback" not in logs, logs[-4000:]


def block_namespace(helm_block: str) -> str:
    match = re.search(r"--namespace (\S+)", helm_block)
    assert match, helm_block
    return match.group(1)


def check_ready(cp: ControlPlane, namespace: str, runtime: str) -> None:
    """Every object the guide made in ``namespace`` is Ready and its Adapter registered with a task id."""
    basemodel = json.loads(cp.kubectl("get", "basemodel", "llama3-8b", "-n", namespace, "-o", "json").stdout)
    assert basemodel["spec"]["runtime"] == runtime
    assert basemodel["status"]["phase"] == "Ready" and basemodel["status"]["readyReplicas"] == 2
    adapter = json.loads(cp.kubectl("get", "adapter", "llama3-sql", "-n", namespace, "-o", "json").stdout)
    assert adapter["status"]["phase"] == "Ready" and adapter["status"]["taskId"] >= 1, adapter["status"]
    assert adapter["status"]["servedName"] == "sql-assistant"
    deployments = json.loads(cp.kubectl("get", "deployments", "-n", namespace, "-o", "json").stdout)["items"]
    for d in deployments:
        assert d["status"].get("readyReplicas") == d["spec"]["replicas"], (d["metadata"]["name"], d["status"])
    pvcs = json.loads(cp.kubectl("get", "pvc", "-n", namespace, "-o", "json").stdout)["items"]
    assert {p["metadata"]["name"]: p["status"]["phase"] for p in pvcs} == {
        "trtfleet-engines": "Bound", "trtfleet-adapters": "Bound"}
    pods = yaml.safe_load(cp.kubectl("get", "pods", "-n", namespace, "-l", "trtfleet.io/basemodel=llama3-8b",
                                     "-o", "json").stdout)["items"]
    serving = [p for p in pods if "batch.kubernetes.io/job-name" not in p["metadata"]["labels"]]
    assert len(serving) == 2 and all(p["spec"]["nodeName"] == "gpu-node-0" for p in serving)
    assert all(p["spec"].get("imagePullSecrets") == [{"name": "regcred"}] for p in serving)
