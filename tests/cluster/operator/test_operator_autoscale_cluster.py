"""Autoscaling on the real control plane: a real router process holds requests for a base model scaled to
zero, the operator (a subprocess) reads the router's /metrics and scales the BaseModel's Deployment of
kwok pods 0 -> N; once the held requests are answered (the router is given a pod: the echo upstream, a
stand-in for a serving pod, since kwok pods serve nothing), it scales back to 0. And ``kubectl scale``
drives ``spec.serving.replicas`` through the scale subresource."""

from __future__ import annotations

import contextlib
import json
import re
import signal
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest
import yaml
from trtfleet_operator.reconcile.deletioncost import DELETION_COST

from tests.cluster.operator.harness import OperatorProcess, apply, cond, example, get, items, wait_phase, wait_until
from tests.support.controlplane import ControlPlane
from tests.unit.router.harness import write_artifact
from trtfleet.demand import parse_router_metrics

pytestmark = pytest.mark.cluster

TRTFLEET = str(Path(sys.executable).parent / "trtfleet")


def tiny(name: str, replicas: int, autoscaling: dict[str, Any] | None) -> str:
    doc = example("basemodel-reference-tiny.yaml")
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
    peer_port: int
    fleet_file: Path
    logs: list[str]

    def set_backends(self, backends: list[dict[str, str]], adapters: list[dict[str, Any]] | None = None) -> None:
        write_fleet(self.fleet_file, backends, adapters)


def write_fleet(path: Path, backends: list[dict[str, str]], adapters: list[dict[str, Any]] | None = None) -> None:
    """Write the router's fleet file (atomically); its static discovery reloads it on change."""
    fleet = {"baseModels": [{"name": "tiny", "architecture": "reference", "maxInputLen": 128,
                             "maxSeqLen": 256, "backends": backends, "adapters": adapters or []}]}
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


@contextlib.contextmanager
def router_process(tmp_path: Path, extra: tuple[str, ...] = ()) -> Iterator[Router]:
    """``trtfleet router`` with static discovery: base model ``tiny`` with no pod, requests held up to 120 s."""
    fleet_file = tmp_path / "fleet.yaml"
    (tmp_path / "routing.yaml").write_text(yaml.safe_dump({"holdWaitS": 120}))
    write_fleet(fleet_file, [])
    process = subprocess.Popen(
        [TRTFLEET, "router", "--host", "127.0.0.1", "--fleet-config", str(fleet_file), "--policy-config",
         str(tmp_path / "routing.yaml"), "--http-port", "0", "--grpc-port", "-1", "--metrics-port", "0",
         "--peer-port", "0", "--request-timeout-s", "300", "--log-level", "INFO", *extra],
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
        yield Router(process, int(started["http_port"]), int(started["metrics_port"]), int(started["peer_port"]),
                     fleet_file, logs)
    finally:
        _stop(process)


@pytest.fixture
def router(tmp_path: Path) -> Iterator[Router]:
    with router_process(tmp_path) as started:
        yield started


def _echo_upstream() -> tuple[subprocess.Popen[bytes], int]:
    """The echo upstream (a test double of a serving pod: answers ``text``), its gRPC port."""
    echo = subprocess.Popen([sys.executable, "-m", "trtfleet_router.upstream.echo", "--port", "0"],
                            stdout=subprocess.PIPE)
    assert echo.stdout is not None
    found = re.search(r":(\d+) \(http", echo.stdout.readline().decode())
    assert found, "the echo upstream did not say its port"
    return echo, int(found.group(1))


def _log_lines(operator: OperatorProcess, text: str) -> list[str]:
    return [line for log in operator.logs for line in log.read_text(errors="replace").splitlines() if text in line]


def _assert_no_tracebacks(operator: OperatorProcess) -> None:
    assert not _log_lines(operator, "Traceback"), operator.log_tail(120)


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
        # kwok pods turn ready within the decision's second: 0 s is a valid measurement, so wait for the key
        def cold_start_s() -> float | None:
            scaling = (get(cp, ns, "basemodel", "tiny") or {}).get("status", {}).get("autoscaling", {})
            return scaling.get("lastColdStartSeconds")

        wait_until(lambda: cold_start_s() is not None, 30, "the cold start in status")
        cold = cold_start_s()
        assert cold is not None
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
    _assert_no_tracebacks(operator)


def test_a_held_request_scales_from_zero_without_waiting_for_the_next_decision(
    crds: ControlPlane, kube_namespace: str, tmp_path: Path, router: Router
) -> None:
    """The autoscaling timer decides once at start and then every 600 s: only the operator's long poll of the
    router's held requests (``/fleet/v1/held`` on the peer port) can scale the BaseModel up within the test."""
    cp, ns = crds, kube_namespace
    operator = OperatorProcess(
        cp, ns, tmp_path,
        extra=("--autoscale-interval", "600", "--held-wait", "20",
               "--router-metrics-url", f"http://127.0.0.1:{router.metrics_port}/metrics",
               "--router-demand-url", f"http://127.0.0.1:{router.peer_port}/fleet/v1/demand"),
    ).start()
    try:
        scaling = {"minReplicas": 0, "maxReplicas": 4, "targetRequestsPerPod": 1}
        apply(cp, ns, tiny("tiny", 0, scaling))
        wait_phase(cp, ns, "basemodel", "tiny", "Ready", timeout=60)
        wait_until(lambda: cond(get(cp, ns, "basemodel", "tiny"), "ScalingActive").get("reason") == "Steady", 30,
                   "the autoscaler's first decision (steady at zero)")
        # the daemon's first contact with the router (nothing held) is logged at DEBUG only: a request held
        # before it is seen there as held on first contact, and decided on the same way
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{router.http_port}/v1", api_key="x", max_retries=0,
                               timeout=300)
        errors: list[BaseException] = []

        def ask() -> None:
            try:
                client.completions.create(model="tiny", prompt="held", max_tokens=16)
            except openai.APIError as exc:
                errors.append(exc)

        threads = [threading.Thread(target=ask)]
        threads[0].start()
        # 60 s bounds a loaded machine's operator start and API calls; the next timer decision is 600 s away
        wait_until(lambda: _deployment_replicas(cp, ns, "tiny")[0] == 1, 60, "scaled 0 -> 1 by the held request")
        bm = get(cp, ns, "basemodel", "tiny")
        assert bm is not None and bm["status"]["autoscaling"]["lastDemand"]["heldRequests"] == 1
        assert _events(cp, ns, "ScaledFromZero"), "no ScaledFromZero event"
        # the backlog grows while the pod starts (the router still has none): two more held requests are more
        # than one pod at 1 per pod takes, so the watch decides again: 1 -> 3
        threads += [threading.Thread(target=ask) for _ in range(2)]
        for thread in threads[1:]:
            thread.start()
        wait_until(lambda: _deployment_replicas(cp, ns, "tiny")[0] == 3, 60, "sized to the backlog: 3 pods")
        decisions = _log_lines(operator, "held requests: deciding now")
        assert len(decisions) >= 2, decisions
        echo, port = _echo_upstream()
        try:
            router.set_backends([{"address": f"127.0.0.1:{port}", "podId": "echo0"}])
            for thread in threads:
                thread.join(timeout=60)
        finally:
            _stop(echo)
        assert errors == []
    finally:
        operator.stop()
    _assert_no_tracebacks(operator)


def test_a_batch_scales_its_base_model_from_zero_and_back(
    crds: ControlPlane, kube_namespace: str, tmp_path: Path
) -> None:
    """A batch submitted while the base model has no pod: its lines are held like any request, so they are the
    demand that scales the BaseModel from zero (at once, through the operator's long poll); the batch completes
    once the router has a pod, and with no demand left the fleet goes back to zero."""
    cp, ns = crds, kube_namespace
    with router_process(tmp_path, ("--batch-store", str(tmp_path / "store"), "--batch-concurrency", "4")) as router:
        operator = OperatorProcess(
            cp, ns, tmp_path,
            extra=("--autoscale-interval", "1", "--router-metrics-url",
                   f"http://127.0.0.1:{router.metrics_port}/metrics",
                   "--router-demand-url", f"http://127.0.0.1:{router.peer_port}/fleet/v1/demand"),
        ).start()
        echo: subprocess.Popen[bytes] | None = None
        try:
            scaling = {"minReplicas": 0, "maxReplicas": 2, "targetRequestsPerPod": 4,
                       "scaleDownStabilizationSeconds": 2, "scaleToZeroAfterSeconds": 4}
            apply(cp, ns, tiny("tiny", 0, scaling))
            wait_phase(cp, ns, "basemodel", "tiny", "Ready", timeout=60)
            client = openai.OpenAI(base_url=f"http://127.0.0.1:{router.http_port}/v1", api_key="x", max_retries=0)
            lines = "".join(
                json.dumps({"custom_id": f"line-{i}", "method": "POST", "url": "/v1/completions",
                            "body": {"model": "tiny", "prompt": f"batch {i}", "max_tokens": 8}}) + "\n"
                for i in range(12)
            )
            upload = client.files.create(file=("lines.jsonl", lines.encode()), purpose="batch")
            batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/completions", completion_window="24h")
            # the batch's lines in flight (4) are held: one pod at 4 per pod
            wait_until(lambda: _deployment_replicas(cp, ns, "tiny")[0] >= 1, 60, "scaled from zero by the batch")
            assert _events(cp, ns, "ScaledFromZero"), "no ScaledFromZero event"
            assert client.batches.retrieve(batch.id).status == "in_progress"
            echo, port = _echo_upstream()
            router.set_backends([{"address": f"127.0.0.1:{port}", "podId": "echo0"}])
            wait_until(lambda: client.batches.retrieve(batch.id).status == "completed", 120, "the batch completed")
            done = client.batches.retrieve(batch.id)
            assert done.request_counts is not None and done.request_counts.completed == 12
            assert done.output_file_id is not None
            output = [json.loads(row) for row in client.files.content(done.output_file_id).text.splitlines()]
            assert sorted(row["custom_id"] for row in output) == sorted(f"line-{i}" for i in range(12))
            # nothing left to do: back to zero after the 4 s window
            wait_until(lambda: _deployment_replicas(cp, ns, "tiny")[0] == 0, 90, "scaled back to zero")
            assert _events(cp, ns, "ScaledToZero"), "no ScaledToZero event"
        finally:
            if echo is not None:
                _stop(echo)
            operator.stop()
    _assert_no_tracebacks(operator)


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


def _warm_demand(router: Router) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{router.metrics_port}/metrics", timeout=10) as response:
        return dict(parse_router_metrics(response.read().decode(), "tiny").pod_warm_demand)


def test_scale_down_removes_the_pod_whose_warm_adapters_are_worth_least(
    crds: ControlPlane, kube_namespace: str, tmp_path: Path, router: Router
) -> None:
    """Two kwok serving pods, each fronted in the router by an echo upstream named after it; adapter a1 is
    asked for, so one pod holds it warm. On the scale-down to one pod the operator sets the pods'
    deletion cost from the router's warm demand, and the ReplicaSet controller removes the other pod."""
    cp, ns = crds, kube_namespace
    operator = OperatorProcess(
        cp, ns, tmp_path,
        extra=("--autoscale-interval", "1", "--router-metrics-url",
               f"http://127.0.0.1:{router.metrics_port}/metrics"),
    ).start()
    echoes: list[subprocess.Popen[bytes]] = []
    try:
        apply(cp, ns, tiny("tiny", 2, None))
        wait_until(lambda: _deployment_replicas(cp, ns, "tiny") == (2, 2), 90, "2 ready serving pods")
        selector = "trtfleet.io/basemodel=tiny,trtfleet.io/role=base"
        names = sorted(p["metadata"]["name"] for p in items(cp, ns, "pods", selector))
        assert len(names) == 2, names
        backends = []
        for name in names:
            echo, port = _echo_upstream()
            echoes.append(echo)
            backends.append({"address": f"127.0.0.1:{port}", "podId": name})
        sha = write_artifact(tmp_path / "a1")
        router.set_backends(backends, [{"servedName": "a1", "taskId": 101, "artifact": str(tmp_path / "a1"),
                                        "sha256": sha}])
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{router.http_port}/v1", api_key="x", max_retries=0,
                               timeout=60)

        answers: list[str] = []

        def ask() -> bool:
            try:
                answers.append(client.completions.create(model="a1", prompt="warm", max_tokens=8).choices[0].text)
            except openai.APIError as exc:
                answers.append(repr(exc))  # the router has not read the new fleet file yet
                return False
            return answers[-1].startswith("[101]")  # the echo upstream's answer with adapter task 101

        try:
            wait_until(ask, 30, "the router to serve a1")
        except AssertionError as exc:
            raise AssertionError(f"{answers[-3:]}\n{''.join(router.logs[-20:])}") from exc
        for _ in range(2):
            assert ask()
        warm = wait_until(lambda: (lambda w: w if set(w) == set(names) else None)(_warm_demand(router)), 30,
                          "the router's warm demand of both pods")
        hot = [name for name in names if warm[name] > 0]
        assert len(hot) == 1, warm  # the adapter-aware router kept a1 on one pod
        cold = next(name for name in names if name not in hot)

        apply(cp, ns, tiny("tiny", 2, {"minReplicas": 1, "maxReplicas": 2, "targetRequestsPerPod": 1,
                                       "scaleDownStabilizationSeconds": 2}))
        wait_until(lambda: _deployment_replicas(cp, ns, "tiny") == (1, 1), 90, "the scale-down to 1 pod")
        left = wait_until(lambda: (lambda ps: ps if len(ps) == 1 else None)(
            [p for p in items(cp, ns, "pods", selector) if not p["metadata"].get("deletionTimestamp")]), 60,
            "one serving pod left")
        assert left[0]["metadata"]["name"] == hot[0], (hot, cold)
        assert left[0]["metadata"]["annotations"][DELETION_COST] == str(round(warm[hot[0]]))
    finally:
        for echo in echoes:
            _stop(echo)
        operator.stop()
