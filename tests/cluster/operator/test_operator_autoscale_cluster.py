"""Autoscaling from zero on the real control plane: a real router process holds requests for a base model
scaled to zero, the operator (a subprocess) reads the router's /metrics (and long-polls its held requests)
and scales the BaseModel's Deployment of kwok pods 0 -> N; once the held requests are answered (the router
is given a pod: the echo upstream, a stand-in for a serving pod, since kwok pods serve nothing), it scales
back to 0. A batch submitted at zero pods does the same. Sizing at a given scale:
``test_operator_autoscale_scaling_cluster.py``."""

from __future__ import annotations

import json
import subprocess
import threading
from pathlib import Path

import openai
import pytest

from tests.cluster.operator.autoscale_support import (
    Router,
    assert_no_tracebacks,
    autoscaling_operator,
    deployment_replicas,
    echo_upstream,
    events,
    log_lines,
    router_process,
    stop_process,
    tiny,
)
from tests.cluster.operator.harness import apply, cond, get, wait_phase, wait_until
from tests.support.controlplane import ControlPlane

pytestmark = pytest.mark.cluster


def test_held_requests_scale_from_zero_and_idle_scales_back(
    crds: ControlPlane, kube_namespace: str, tmp_path: Path, router: Router
) -> None:
    cp, ns = crds, kube_namespace
    operator = autoscaling_operator(cp, ns, tmp_path, router)
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
        wait_until(lambda: deployment_replicas(cp, ns, "tiny") == (3, 3), 90, "3 ready serving pods")
        bm = get(cp, ns, "basemodel", "tiny")
        assert bm is not None and bm["spec"]["serving"]["replicas"] == 3
        assert bm["status"]["autoscaling"]["desiredReplicas"] == 3
        assert bm["status"]["autoscaling"]["lastDemand"]["heldRequests"] == 3
        assert cond(bm, "ScalingActive")["status"] == "True"
        assert events(cp, ns, "ScaledFromZero"), "no ScaledFromZero event"
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
        assert events(cp, ns, "ColdStart"), "no ColdStart event"
        listed = cp.kubectl("get", "basemodel", "tiny", "-n", ns).stdout
        assert "COLDSTART" in listed.splitlines()[0], listed

        # the router gets a pod: the held requests are answered, nothing is lost
        echo, port = echo_upstream()
        router.set_backends([{"address": f"127.0.0.1:{port}", "podId": "echo0"}])
        for thread in threads:
            thread.join(timeout=60)
        assert errors == [] and sorted(answers) == ["held 0", "held 1", "held 2"]

        # no demand: down after the 2 s window, to zero after 4 s without any
        wait_until(lambda: deployment_replicas(cp, ns, "tiny")[0] == 0, 90, "scaled back to zero")
        bm = get(cp, ns, "basemodel", "tiny")
        assert bm is not None and bm["status"]["autoscaling"]["desiredReplicas"] == 0
        assert events(cp, ns, "ScaledToZero"), "no ScaledToZero event"
        metrics = operator.metrics().splitlines()
        decisions = [line for line in metrics if line.startswith("trtfleet_operator_scalings_total")]
        assert any('reason="ScaledFromZero"' in line for line in decisions), decisions
    finally:
        if echo is not None:
            stop_process(echo)
        operator.stop()
    assert_no_tracebacks(operator)


def test_a_held_request_scales_from_zero_without_waiting_for_the_next_decision(
    crds: ControlPlane, kube_namespace: str, tmp_path: Path, router: Router
) -> None:
    """The autoscaling timer decides once at start and then every 600 s: only the operator's long poll of the
    router's held requests (``/fleet/v1/held`` on the peer port) can scale the BaseModel up within the test."""
    cp, ns = crds, kube_namespace
    operator = autoscaling_operator(
        cp, ns, tmp_path, router, 600, "--held-wait", "20", "--router-demand-url", router.demand_url
    )
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
        wait_until(lambda: deployment_replicas(cp, ns, "tiny")[0] == 1, 60, "scaled 0 -> 1 by the held request")
        bm = get(cp, ns, "basemodel", "tiny")
        assert bm is not None and bm["status"]["autoscaling"]["lastDemand"]["heldRequests"] == 1
        assert events(cp, ns, "ScaledFromZero"), "no ScaledFromZero event"
        # the backlog grows while the pod starts (the router still has none): two more held requests are more
        # than one pod at 1 per pod takes, so the watch decides again: 1 -> 3
        threads += [threading.Thread(target=ask) for _ in range(2)]
        for thread in threads[1:]:
            thread.start()
        wait_until(lambda: deployment_replicas(cp, ns, "tiny")[0] == 3, 60, "sized to the backlog: 3 pods")
        decisions = log_lines(operator, "held requests: decided at once")
        assert len(decisions) >= 2, decisions
        echo, port = echo_upstream()
        try:
            router.set_backends([{"address": f"127.0.0.1:{port}", "podId": "echo0"}])
            for thread in threads:
                thread.join(timeout=60)
        finally:
            stop_process(echo)
        assert errors == []
    finally:
        operator.stop()
    assert_no_tracebacks(operator)


def test_a_batch_scales_its_base_model_from_zero_and_back(
    crds: ControlPlane, kube_namespace: str, tmp_path: Path
) -> None:
    """A batch submitted while the base model has no pod: its lines are held like any request, so they are the
    demand that scales the BaseModel from zero (at once, through the operator's long poll); the batch completes
    once the router has a pod, and with no demand left the fleet goes back to zero."""
    cp, ns = crds, kube_namespace
    with router_process(tmp_path, ("--batch-store", str(tmp_path / "store"), "--batch-concurrency", "4")) as router:
        operator = autoscaling_operator(
            cp, ns, tmp_path, router, 1, "--router-demand-url", router.demand_url
        )
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
            wait_until(lambda: deployment_replicas(cp, ns, "tiny")[0] >= 1, 60, "scaled from zero by the batch")
            assert events(cp, ns, "ScaledFromZero"), "no ScaledFromZero event"
            assert client.batches.retrieve(batch.id).status == "in_progress"
            echo, port = echo_upstream()
            router.set_backends([{"address": f"127.0.0.1:{port}", "podId": "echo0"}])
            wait_until(lambda: client.batches.retrieve(batch.id).status == "completed", 120, "the batch completed")
            done = client.batches.retrieve(batch.id)
            assert done.request_counts is not None and done.request_counts.completed == 12
            assert done.output_file_id is not None
            output = [json.loads(row) for row in client.files.content(done.output_file_id).text.splitlines()]
            assert sorted(row["custom_id"] for row in output) == sorted(f"line-{i}" for i in range(12))
            # nothing left to do: back to zero after the 4 s window
            wait_until(lambda: deployment_replicas(cp, ns, "tiny")[0] == 0, 90, "scaled back to zero")
            assert events(cp, ns, "ScaledToZero"), "no ScaledToZero event"
        finally:
            if echo is not None:
                stop_process(echo)
            operator.stop()
    assert_no_tracebacks(operator)
