"""Batch resources against the real kube-apiserver, run by a real router in front of reference workers:
a ``kubectl apply``-ed Batch becomes the same batch as ``POST /v1/batches`` (visible through the openai
client), its status follows the record, outputs are copied to ``spec.output``; cancel through the spec;
an unreadable input fails the Batch with a message; the CRD's CEL rules hold."""

from __future__ import annotations

import asyncio
import functools
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from trtfleet_router.batch.leader import LeaderElection
from trtfleet_router.batch.resources import BatchResources
from trtfleet_router.batch.wiring import BatchSettings
from trtfleet_router.discovery.kubeclient import KubeClient

from tests.integration.router.support import ConvertedAdapter, reference_workers, router_for
from tests.integration.router.test_router_cli import _router_port
from tests.support.controlplane import ControlPlane, KubectlError, eventually
from tests.unit.router.harness import RouterThread
from trtfleet.batch.runner import RunnerSettings
from trtfleet.kube import KubeSource, load_connection

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def crds(control_plane: ControlPlane) -> ControlPlane:
    control_plane.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "crds"))
    control_plane.wait_established("batches.trtfleet.io")

    def served() -> bool:
        return control_plane.kubectl("get", "batches", "-A", check=False).returncode == 0

    eventually(served, timeout=30, what="batches to be served")
    return control_plane


@pytest.fixture
def router(
    crds: ControlPlane, kube_namespace: str, converted_adapters: list[ConvertedAdapter], tmp_path: Path
) -> Iterator[RouterThread]:
    """A router with a batch store that also follows the namespace's Batches (as --kubernetes does)."""
    settings = BatchSettings(
        store=str(tmp_path / "store"), runner=RunnerSettings(chunk_interval_s=0.2, idle_poll_s=0.5)
    )
    with reference_workers(count=1) as workers, router_for(workers, converted_adapters, batch=settings) as started:
        parts = started.router.batch
        assert parts is not None

        async def follow() -> tuple[asyncio.Task[None], KubeClient]:
            source = KubeSource(kubeconfig=str(crds.kubeconfig))
            client = KubeClient(source, await load_connection(source))
            resources = BatchResources(client, kube_namespace, parts.service, sync_interval_s=0.2)
            return asyncio.create_task(resources.run()), client

        task, client = started.loop.run(follow())
        try:
            yield started
        finally:

            async def stop() -> None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                await client.close()

            started.loop.run(stop())


def _apply(cp: ControlPlane, ns: str, name: str, spec: dict[str, Any]) -> None:
    batch = {"apiVersion": "trtfleet.io/v1alpha1", "kind": "Batch", "metadata": {"name": name}, "spec": spec}
    cp.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(batch))


def _status(cp: ControlPlane, ns: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(cp.kubectl("get", "batch", name, "-n", ns, "-o", "json").stdout)
    return found.get("status") or {}


def _phase_in(cp: ControlPlane, ns: str, name: str, phases: set[str]) -> dict[str, Any] | None:
    status = _status(cp, ns, name)
    return status if status.get("phase") in phases else None


def test_an_applied_batch_runs_like_an_api_batch(
    crds: ControlPlane,
    kube_namespace: str,
    router: RouterThread,
    converted_adapters: list[ConvertedAdapter],
    tmp_path: Path,
) -> None:
    cp, ns = crds, kube_namespace
    adapter = converted_adapters[0].name
    rows = [
        {
            "custom_id": f"r{i}",
            "method": "POST",
            "url": "/v1/completions",
            "body": {"prompt": f"hi {i}", "max_tokens": 8},
        }
        for i in range(6)
    ]
    rows.append({"custom_id": "bad", "method": "GET", "url": "/v1/completions", "body": {}})
    source = tmp_path / "input" / "in.jsonl"
    source.parent.mkdir()
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    _apply(cp, ns, "nightly", {"input": str(source), "model": adapter, "output": f"file://{out}", "priority": 5})
    status = eventually(
        functools.partial(_phase_in, cp, ns, "nightly", {"Succeeded", "Failed"}), timeout=180, what="the batch to end"
    )
    assert status["phase"] == "Succeeded", status
    assert status["counts"] == {"total": 7, "completed": 6, "failed": 1} and status["progressPercent"] == 100
    assert status["outputUri"] == f"file://{out}/output.jsonl" and status["errorUri"] == f"file://{out}/errors.jsonl"
    assert [c["type"] for c in status["conditions"]] == ["Complete"] and status["conditions"][0]["status"] == "True"
    copied = [json.loads(line) for line in (out / "output.jsonl").read_text().splitlines()]
    assert [r["custom_id"] for r in copied] == [f"r{i}" for i in range(6)]
    assert json.loads((out / "errors.jsonl").read_text())["error"]["code"] == "invalid_method"

    client = openai.OpenAI(base_url=router.http_url + "/v1", api_key="unused", max_retries=0, timeout=60)
    same = client.batches.retrieve(status["batchId"])  # the same batch through the OpenAI API
    assert same.status == "completed" and same.output_file_id == status["outputFileId"]
    online = client.completions.create(model=adapter, prompt="hi 0", max_tokens=8)
    assert copied[0]["response"]["body"]["choices"][0]["text"] == online.choices[0].text

    with pytest.raises(KubectlError, match="immutable"):
        cp.kubectl("patch", "batch", "nightly", "-n", ns, "--type=merge", "-p", json.dumps({"spec": {"input": "/x"}}))


def test_cancel_through_the_spec_and_an_unreadable_input(
    crds: ControlPlane, kube_namespace: str, router: RouterThread, tmp_path: Path
) -> None:
    cp, ns = crds, kube_namespace
    _apply(cp, ns, "never", {"input": str(tmp_path / "missing.jsonl"), "model": "tiny"})
    failed = eventually(functools.partial(_phase_in, cp, ns, "never", {"Failed"}), timeout=60, what="Failed")
    assert "missing.jsonl" in failed["message"]

    source = tmp_path / "in.jsonl"
    source.write_text(json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {}}) + "\n")
    _apply(cp, ns, "stopped", {"input": str(source), "model": "tiny", "cancel": True})
    eventually(functools.partial(_phase_in, cp, ns, "stopped", {"Cancelled"}), timeout=60, what="Cancelled")
    with pytest.raises(KubectlError, match="stays cancelled"):
        cp.kubectl("patch", "batch", "stopped", "-n", ns, "--type=merge", "-p", json.dumps({"spec": {"cancel": False}}))


def test_one_batch_runner_among_replicas_and_a_takeover_after_a_kill(crds: ControlPlane, kube_namespace: str) -> None:
    """Two replicas' elections on the real API server: one leads; when it dies without releasing the
    Lease (its loop cancelled, as SIGKILL would), the other takes over once the Lease expired."""

    async def scenario() -> None:
        source = KubeSource(kubeconfig=str(crds.kubeconfig))
        client = KubeClient(source, await load_connection(source))
        running: dict[str, asyncio.Event] = {"a": asyncio.Event(), "b": asyncio.Event()}

        def work(name: str) -> Any:
            async def run() -> None:
                running[name].set()
                await asyncio.Event().wait()

            return run

        elections = {
            name: LeaderElection(client, kube_namespace, identity=name, lease_duration_s=2.0, renew_interval_s=0.5)
            for name in running
        }
        first = asyncio.create_task(elections["a"].run(work("a")))
        await asyncio.wait_for(running["a"].wait(), 30)
        second = asyncio.create_task(elections["b"].run(work("b")))
        for _ in range(4):  # a few renew rounds: the follower never starts its runner
            await asyncio.sleep(elections["b"].renew_interval_s)
            assert not running["b"].is_set()
        first.cancel()  # the leader dies holding the Lease
        await asyncio.gather(first, return_exceptions=True)
        await asyncio.wait_for(running["b"].wait(), 30)
        lease = await client.api().request("GET", f"{elections['b'].path}/trtfleet-batch-runner")
        assert lease["spec"]["holderIdentity"] == "b" and lease["spec"]["leaseTransitions"] == 1
        second.cancel()
        await asyncio.gather(second, return_exceptions=True)
        await client.close()

    asyncio.run(scenario())


def test_a_router_process_leads_and_runs_applied_batches(
    crds: ControlPlane, kube_namespace: str, tmp_path: Path
) -> None:
    """``trtfleet router --kubernetes --batch-store``: the whole wiring in one real process (Lease, Batch
    watch, runner, status). The namespace serves no model, so every line is a ``model_not_found`` line."""
    cp, ns = crds, kube_namespace
    source = tmp_path / "in.jsonl"
    line = {"custom_id": "only", "method": "POST", "url": "/v1/completions", "body": {"model": "nope", "prompt": "x"}}
    source.write_text(json.dumps(line) + "\n")
    router = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "trtfleet"),
            "router",
            "--kubernetes",
            "--namespace",
            ns,
            "--batch-store",
            str(tmp_path / "store"),
            "--host",
            "127.0.0.1",
            "--http-port",
            "0",
            "--grpc-port",
            "-1",
            "--metrics-port",
            "-1",
        ],
        stderr=subprocess.PIPE,
        env={**os.environ, "KUBECONFIG": str(cp.kubeconfig)},
    )
    logs: list[str] = []
    try:
        _router_port(router, logs)
        _apply(cp, ns, "unservable", {"input": str(source)})
        status = eventually(
            functools.partial(_phase_in, cp, ns, "unservable", {"Succeeded", "Failed"}), timeout=120, what="the end"
        )
        assert status["phase"] == "Succeeded" and status["counts"] == {"total": 1, "completed": 0, "failed": 1}
        lease = json.loads(cp.kubectl("get", "lease", "trtfleet-batch-runner", "-n", ns, "-o", "json").stdout)
        assert lease["spec"]["holderIdentity"]
    finally:
        router.send_signal(signal.SIGTERM)
        try:
            router.wait(timeout=30)
        except subprocess.TimeoutExpired:
            router.kill()
            router.wait()
