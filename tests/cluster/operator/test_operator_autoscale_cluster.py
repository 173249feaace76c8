"""Autoscaling on the real control plane: a real router process holds requests for a base model scaled to
zero, the operator (a subprocess) reads the router's /metrics and scales the BaseModel's Deployment of
kwok pods 0 -> N; once the held requests are answered (the router is given a pod: the echo upstream, a
stand-in for a serving pod, since kwok pods serve nothing), it scales back to 0. And ``kubectl scale``
drives ``spec.serving.replicas`` through the scale subresource."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest
import yaml

from tests.cluster.operator.harness import OperatorProcess, apply, cond, get, items, wait_phase, wait_until
from tests.support.controlplane import ControlPlane

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[3]
TRTFLEET = str(Path(sys.executable).parent / "trtfleet")


def tiny(name: str, replicas: int, autoscaling: dict[str, Any] | None) -> str:
    doc = yaml.safe_load((ROOT / "examples" / "basemodel-reference-tiny.yaml").read_text())
    doc["metadata"]["name"] = name
    doc["spec"]["serving"]["replicas"] = replicas
    if autoscaling is not None:
        doc["spec"]["autoscaling"] = autoscaling
    return yaml.safe_dump(doc)


@dataclass
class Router:
    process: subprocess.Popen[bytes]
    http_port: int
    metrics_port: int
    fleet_file: Path
    logs: list[str]

    def set_backends(self, backends: list[dict[str, str]]) -> None:
        write_fleet(self.fleet_file, backends)


def write_fleet(path: Path, backends: list[dict[str, str]]) -> None:
    """Write the router's fleet file (atomically); its static discovery reloads it on change."""
    fleet = {"baseModels": [{"name": "tiny", "architecture": "reference", "maxInputLen": 128,
                             "maxSeqLen": 256, "backends": backends}]}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(fleet))
    tmp.replace(path)


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture
def router(tmp_path: Path) -> Iterator[Router]:
    """``trtfleet router`` with static discovery: base model ``tiny`` with no pod, requests held up to 120 s."""
    fleet_file = tmp_path / "fleet.yaml"
    (tmp_path / "routing.yaml").write_text(yaml.safe_dump({"holdWaitS": 120}))
    write_fleet(fleet_file, [])
    process = subprocess.Popen(
        [TRTFLEET, "router", "--host", "127.0.0.1", "--fleet-config", str(fleet_file), "--policy-config",
         str(tmp_path / "routing.yaml"), "--http-port", "0", "--grpc-port", "-1", "--metrics-port", "0",
         "--request-timeout-s", "300", "--log-level", "INFO"],
        stderr=subprocess.PIPE,
    )
    assert process.stderr is not None
    logs: list[str] = []
    started: dict[str, Any] = {}
    for raw in process.stderr:
        line = raw.decode()
        logs.append(line)
        if line.startswith("{") and json.loads(line).get("msg") == "router started":
            started = json.loads(line)
            break
    assert started, f"the router did not start: {''.join(logs)[-2000:]}"
    stderr = process.stderr
    threading.Thread(target=lambda: logs.extend(r.decode() for r in stderr), daemon=True).start()
    try:
        yield Router(process, int(started["http_port"]), int(started["metrics_port"]), fleet_file, logs)
    finally:
        _stop(process)


def _echo_upstream() -> tuple[subprocess.Popen[bytes], int]:
    """The echo upstream (a test double of a serving pod: answers ``text``), its gRPC port."""
    echo = subprocess.Popen([sys.executable, "-m", "trtfleet_router.upstream.echo", "--port", "0"],
                            stdout=subprocess.PIPE)
    assert echo.stdout is not None
    found = re.search(r":(\d+) \(http", echo.stdout.readline().decode())
    assert found, "the echo upstream did not say its port"
    return echo, int(found.group(1))


def _events(cp: ControlPlane, ns: str, reason: str) -> list[dict[str, Any]]:
    return [e for e in items(cp, ns, "events") if e.get("reason") == reason
            and e["involvedObject"].get("kind") == "BaseModel"]


def _deployment_replicas(cp: ControlPlane, ns: str, name: str) -> tuple[int, int]:
    deployment = get(cp, ns, "deployment", name) or {}
    return int(deployment.get("spec", {}).get("replicas", -1)), int(
        (deployment.get("status") or {}).get("readyReplicas") or 0
    )


def test_held_requests_scale_from_zero_and_idle_scales_back(
    crds: ControlPlane, kube_namespace: str, tmp_path: Path, router: Router
) -> None:
    cp, ns = crds, kube_namespace
    operator = OperatorProcess(
        cp, ns, tmp_path,
        extra=("--autoscale-interval", "1", "--router-metrics-url",
               f"http://127.0.0.1:{router.metrics_port}/metrics"),
    ).start()
    echo: subprocess.Popen[bytes] | None = None
    try:
        scaling = {"minReplicas": 0, "maxReplicas": 4, "targetRequestsPerPod": 1,
                   "scaleDownStabilizationSeconds": 2, "scaleToZeroAfterSeconds": 4}
        apply(cp, ns, tiny("tiny", 0, scaling))
        bm = wait_phase(cp, ns, "basemodel", "tiny", "Ready", timeout=60)
        assert cond(bm, "Ready")["reason"] == "ScaledToZero"
        wait_until(lambda: cond(get(cp, ns, "basemodel", "tiny"), "ScalingActive").get("reason") == "Steady", 30,
                   "the autoscaler's first decision (steady at zero)")

        client = openai.OpenAI(base_url=f"http://127.0.0.1:{router.http_port}/v1", api_key="x", max_retries=0,
                               timeout=300)
        answers: list[str] = []
        errors: list[BaseException] = []

        def ask(prompt: str) -> None:
            try:
                answers.append(client.completions.create(model="tiny", prompt=prompt, max_tokens=16).choices[0].text)
            except openai.APIError as exc:
                errors.append(exc)

        threads = [threading.Thread(target=ask, args=(f"held {i}",)) for i in range(3)]
        for thread in threads:
            thread.start()
        # three held requests at one per pod: 0 -> 3 pods, the Deployment follows and its kwok pods get ready
        wait_until(lambda: _deployment_replicas(cp, ns, "tiny") == (3, 3), 90, "3 ready serving pods")
        bm = get(cp, ns, "basemodel", "tiny")
        assert bm is not None and bm["spec"]["serving"]["replicas"] == 3
        assert bm["status"]["autoscaling"]["desiredReplicas"] == 3
        assert bm["status"]["autoscaling"]["lastDemand"]["heldRequests"] == 3
        assert cond(bm, "ScalingActive")["status"] == "True"
        assert _events(cp, ns, "ScaledFromZero"), "no ScaledFromZero event"
        assert not answers and not errors  # still held: no pod the router can reach yet
        # the cold start: from the scale-up decision to the first kwok pod's Ready transition, in status
        cold = wait_until(lambda: (get(cp, ns, "basemodel", "tiny") or {}).get("status", {}).get(
            "autoscaling", {}).get("lastColdStartSeconds"), 30, "the cold start in status")
        assert 0 <= cold < 90
        assert "scaleUpTime" not in get(cp, ns, "basemodel", "tiny")["status"]["autoscaling"]
        assert _events(cp, ns, "ColdStart"), "no ColdStart event"
        listed = cp.kubectl("get", "basemodel", "tiny", "-n", ns).stdout
        assert "COLDSTART" in listed.splitlines()[0], listed

        # the router gets a pod: the held requests are answered, nothing is lost
        echo, port = _echo_upstream()
        router.set_backends([{"address": f"127.0.0.1:{port}", "podId": "echo0"}])
        for thread in threads:
            thread.join(timeout=60)
        assert errors == [] and sorted(answers) == ["held 0", "held 1", "held 2"]

        # no demand: down after the 2 s window, to zero after 4 s without any
        wait_until(lambda: _deployment_replicas(cp, ns, "tiny")[0] == 0, 90, "scaled back to zero")
        bm = get(cp, ns, "basemodel", "tiny")
        assert bm is not None and bm["status"]["autoscaling"]["desiredReplicas"] == 0
        assert _events(cp, ns, "ScaledToZero"), "no ScaledToZero event"
        metrics = operator.metrics().splitlines()
        decisions = [line for line in metrics if line.startswith("trtfleet_operator_scalings_total")]
        assert any('reason="ScaledFromZero"' in line for line in decisions), decisions
    finally:
        if echo is not None:
            _stop(echo)
        operator.stop()
    tracebacks = [line for log in operator.logs for line in log.read_text(errors="replace").splitlines()
                  if "Traceback" in line]
    assert not tracebacks, operator.log_tail(120)


def test_kubectl_scale_drives_the_deployment(operator: OperatorProcess) -> None:
    cp, ns = operator.cp, operator.namespace
    apply(cp, ns, tiny("fixed", 1, None))
    wait_phase(cp, ns, "basemodel", "fixed", "Ready", timeout=60)
    cp.kubectl("scale", "basemodel", "fixed", "-n", ns, "--replicas", "3")
    wait_until(lambda: _deployment_replicas(cp, ns, "fixed") == (3, 3), 60, "the Deployment at 3 ready pods")

    def scale() -> dict[str, Any] | None:
        res = cp.kubectl("get", "--raw", f"/apis/trtfleet.io/v1alpha1/namespaces/{ns}/basemodels/fixed/scale")
        view = json.loads(res.stdout)
        return view if view.get("status", {}).get("replicas") == 3 else None

    view = wait_until(scale, 60, "the scale subresource to report 3 ready pods")
    assert view["spec"]["replicas"] == 3
    assert view["status"]["selector"] == "trtfleet.io/basemodel=fixed,trtfleet.io/role=base"

    # with autoscaling set, replicas is the operator's within [min, max]: out of range is refused
    apply(cp, ns, tiny("scaled", 1, {"minReplicas": 1, "maxReplicas": 2}))
    refused = cp.kubectl("scale", "basemodel", "scaled", "-n", ns, "--replicas", "5", check=False)
    assert refused.returncode != 0 and "operator's to set" in refused.stderr
    refused = cp.kubectl("apply", "-n", ns, "-f", "-", input=tiny("bad", 1, {"minReplicas": 3, "maxReplicas": 2}),
                         check=False)
    assert refused.returncode != 0 and "minReplicas must not exceed" in refused.stderr
