"""Merge advice on the real control plane: a real router process serves adapter traffic (the echo upstream
stands in for a serving pod, since kwok pods serve nothing) and its demand view on its peer port; the
operator (a subprocess) reads ``/fleet/v1/demand``, writes ``MergeRecommended`` and ``status.merge`` on
every Adapter of the BaseModel, ``kubectl get adapters`` shows the suggestion, and the ``mode: auto``
Adapter the traffic keeps busy gets its merged Deployment. With the router gone the advice turns Unknown
and nothing switches back. On a ``pytorch`` BaseModel, ``mode: auto`` chosen merged gets the merged
prepare Job, as ``mode: merged`` does."""

from __future__ import annotations

import json
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
import yaml

from tests.cluster.operator.autoscale_support import echo_upstream, stop_process
from tests.cluster.operator.harness import (
    PREPARES,
    ROOT,
    TRTFLEET,
    OperatorProcess,
    apply,
    cond,
    finish_job_pod,
    get,
    items,
    llama_doc,
    patch,
    wait_until,
)
from tests.integration.router.support import convert_adapters
from tests.support.controlplane import ControlPlane

pytestmark = pytest.mark.cluster

MERGING = {"podRequestsPerSecond": 0.05, "sustainSeconds": 0, "minDwellSeconds": 0, "maxMergedAdapters": 1}


def basemodel() -> str:
    doc = yaml.safe_load((ROOT / "examples" / "basemodel-reference-tiny.yaml").read_text())
    doc["spec"]["merging"] = MERGING
    return yaml.safe_dump(doc)


def adapter(name: str, served: str, mode: str) -> str:
    return yaml.safe_dump({
        "apiVersion": "trtfleet.io/v1alpha1", "kind": "Adapter", "metadata": {"name": name},
        "spec": {"baseModel": "tiny", "mode": mode, "servedName": served,
                 "source": {"uri": f"file:///opt/trtfleet/adapters/{served.removeprefix('tiny-')}"}},
    })


@pytest.fixture
def router(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], int, int]]:
    """``trtfleet router`` over the echo upstream with the converted sample adapters; (process, HTTP port,
    peer port)."""
    echo, grpc_port = echo_upstream()
    adapters = convert_adapters(tmp_path / "adapters")
    fleet = {"baseModels": [{
        "name": "tiny", "architecture": "reference", "maxInputLen": 128, "maxSeqLen": 256,
        "backends": [{"address": f"127.0.0.1:{grpc_port}", "podId": "echo0"}],
        "adapters": [{"servedName": a.name, "taskId": a.task_id, "artifact": str(a.path), "pages": 1}
                     for a in adapters],
    }]}
    (tmp_path / "fleet.yaml").write_text(yaml.safe_dump(fleet))
    process = subprocess.Popen(
        [TRTFLEET, "router", "--host", "127.0.0.1", "--fleet-config", str(tmp_path / "fleet.yaml"),
         "--http-port", "0", "--grpc-port", "-1", "--metrics-port", "-1", "--peer-port", "0", "--log-level", "INFO"],
        stderr=subprocess.PIPE,
    )
    assert process.stderr is not None
    started: dict[str, Any] = {}
    logs: list[str] = []
    for raw in process.stderr:
        logs.append(raw.decode())
        if logs[-1].startswith("{") and json.loads(logs[-1]).get("msg") == "router started":
            started = json.loads(logs[-1])
            break
    assert started, f"the router did not start: {''.join(logs)[-2000:]}"
    stderr = process.stderr
    threading.Thread(target=lambda: [None for _ in stderr], daemon=True).start()
    try:
        yield process, int(started["http_port"]), int(started["peer_port"])
    finally:
        stop_process(process)
        stop_process(echo)


def _merge(cp: ControlPlane, ns: str, name: str) -> dict[str, Any]:
    return ((get(cp, ns, "adapter", name) or {}).get("status") or {}).get("merge") or {}


def test_busy_auto_adapter_is_suggested_and_served_merged(
    crds: ControlPlane, kube_namespace: str, tmp_path: Path, router: tuple[subprocess.Popen[bytes], int, int]
) -> None:
    cp, ns = crds, kube_namespace
    process, http_port, peer_port = router
    operator = OperatorProcess(
        cp, ns, tmp_path,
        extra=("--merge-interval", "1", "--router-demand-url", f"http://127.0.0.1:{peer_port}/fleet/v1/demand"),
    ).start()
    stop = threading.Event()
    answers: list[str] = []
    errors: list[BaseException] = []

    def traffic() -> None:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{http_port}/v1", api_key="x", max_retries=0, timeout=60)
        while not stop.is_set():
            try:
                answers.append(client.completions.create(model="tiny-upper", prompt="hi", max_tokens=4).choices[0].text)
            except openai.APIError as exc:
                errors.append(exc)
                return

    sender = threading.Thread(target=traffic)
    try:
        apply(cp, ns, basemodel())
        apply(cp, ns, adapter("upper", "tiny-upper", "auto"))
        apply(cp, ns, adapter("reverse", "tiny-reverse", "dynamic"))
        sender.start()
        wait_until(lambda: _merge(cp, ns, "upper").get("suggested") == "Merged", 90, "upper suggested merged")
        wait_until(lambda: _merge(cp, ns, "reverse").get("suggested") == "Dynamic", 30, "reverse suggested dynamic")
        upper, reverse = get(cp, ns, "adapter", "upper"), get(cp, ns, "adapter", "reverse")
        assert cond(upper, "MergeRecommended")["status"] == "True"
        assert "of a pod" in cond(upper, "MergeRecommended")["message"]
        assert cond(reverse, "MergeRecommended")["status"] == "False"
        assert reverse is not None and "mode" not in reverse["status"]["merge"]  # advice only: mode dynamic

        table = cp.kubectl("get", "adapters", "-n", ns).stdout.splitlines()
        assert table[0].split()[-3:] == ["MODE", "SUGGESTED", "AGE"], table
        rows = {line.split()[0]: line.split() for line in table[1:]}
        assert rows["upper"][-3:-1] == ["auto", "Merged"] and rows["reverse"][-3:-1] == ["dynamic", "Dynamic"], table
        wide = cp.kubectl("get", "adapters", "-n", ns, "-o", "wide").stdout.splitlines()
        assert "SERVING" in wide[0] and "PODFRACTION" in wide[0], wide

        # mode auto acts on it: served merged, its own Deployment, an Event saying why
        deployment = wait_until(lambda: get(cp, ns, "deployment", "upper-merged"), 60, "the merged Deployment")
        assert deployment["metadata"]["labels"]["trtfleet.io/role"] == "merged"
        assert _merge(cp, ns, "upper")["mode"] == "merged"
        assert wait_until(lambda: [e for e in items(cp, ns, "events") if e.get("reason") == "SwitchedToMerged"], 30,
                          "the SwitchedToMerged event")
        assert get(cp, ns, "deployment", "reverse-merged") is None
        switches = [line for line in operator.metrics().splitlines()
                    if line.startswith("trtfleet_operator_merge_switches_total")]
        assert switches == ['trtfleet_operator_merge_switches_total{mode="merged"} 1.0'], switches
        stop.set()
        sender.join(timeout=60)
        assert errors == [] and answers and all(a for a in answers)

        # the router goes away: Unknown, saying why, and the choice stands
        stop_process(process)
        wait_until(lambda: cond(get(cp, ns, "adapter", "upper"), "MergeRecommended").get("reason")
                   == "NoDemandSignal", 30, "the advice to turn Unknown")
        assert _merge(cp, ns, "upper")["mode"] == "merged" and get(cp, ns, "deployment", "upper-merged")
    finally:
        stop.set()
        if sender.is_alive():
            sender.join(timeout=60)
        operator.stop()
    tracebacks = [line for log in operator.logs for line in log.read_text(errors="replace").splitlines()
                  if "Traceback" in line]
    assert not tracebacks, operator.log_tail(120)


def test_auto_chosen_merged_on_pytorch_gets_the_merged_prepare_job(operator: OperatorProcess) -> None:
    """The operator's observation follows the chosen mode: the merged plan's build objects are read and its
    prepare Job created (the choice is written here as the merge advice would, with no router to read)."""
    cp, ns = operator.cp, operator.namespace
    apply(cp, ns, llama_doc(ns, runtime="pytorch"))
    apply(cp, ns, yaml.safe_dump({
        "apiVersion": "trtfleet.io/v1alpha1", "kind": "Adapter", "metadata": {"name": "sql"},
        "spec": {"baseModel": "llama3-8b", "mode": "auto", "source": {"uri": "s3://adapters/llama3/sql"}},
    }))
    wait_until(lambda: (get(cp, ns, "adapter", "sql") or {}).get("status", {}).get("phase"), 30, "a first status")

    def merged_jobs() -> list[dict[str, Any]]:
        return [j for j in items(cp, ns, "jobs", PREPARES) if j["metadata"]["labels"].get("trtfleet.io/adapter")]

    assert merged_jobs() == []  # auto starts dynamic
    patch(cp, ns, "adapter", "sql", {"status": {"merge": {"mode": "merged"}}}, status=True)
    jobs = wait_until(merged_jobs, 60, "the merged prepare Job of the auto Adapter")
    assert len(jobs) == 1 and jobs[0]["metadata"]["ownerReferences"][0]["name"] == "sql"
    finish_job_pod(cp, ns, jobs[0]["metadata"]["name"], "prepare", exit_code=0, message='{"merged": true}')
    deployment = wait_until(lambda: get(cp, ns, "deployment", "sql-merged"), 60, "the merged Deployment")
    assert deployment["spec"]["template"]["spec"]["containers"][0]["args"][-2:] == ["--served_model_name", "sql"]
    assert get(cp, ns, "adapter", "sql")["status"]["merge"]["mode"] == "merged"
