"""The processes :mod:`bench.router_overhead` and :mod:`bench.peer_overhead` measure: an upstream (the echo server
or one reference worker) and one ``trtfleet router`` in front of it, started on free ports and stopped."""

from __future__ import annotations

import hashlib
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bench.native_loadgen import free_port

ADAPTER = "bench-a"
TASK_ID = 1
ECHO_MODEL = "tensorrt_llm_bls"


def write_adapter(directory: Path) -> None:
    """A small converted adapter (fp16 [1, 8, 64] weights) with its manifest, as the converter writes."""
    directory.mkdir(parents=True, exist_ok=True)
    np.save(directory / "model.lora_weights.npy", np.ones((1, 8, 64), np.float16))
    np.save(directory / "model.lora_config.npy", np.array([[[1, i, 8] for i in range(8)]], np.int32))
    outputs = {
        name: {"sha256": hashlib.sha256((directory / name).read_bytes()).hexdigest(), "size_bytes": 0}
        for name in ("model.lora_weights.npy", "model.lora_config.npy")
    }
    (directory / "manifest.json").write_text(json.dumps({"outputs": outputs, "rank": 8, "weights_bytes": 1024}))


def wait_http(url: str, timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=1) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} not ready after {timeout_s} s")


@dataclass
class Processes:
    """The upstream and the router of one run, with what a client needs to reach each; :meth:`stop` ends them."""

    work: Path
    upstream_grpc: str
    upstream_http: str
    upstream_model: str
    upstream_task_id: int | None
    router_model: str
    router_http: str
    router_grpc: str
    router_pid: int
    upstream_pid: int  # the echo process, or tritonserver (not its Python backend stubs)
    children: list[subprocess.Popen[bytes]] = field(default_factory=list)
    reference_worker: Any = None

    def stop(self) -> None:
        for child in reversed(self.children):
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
                try:
                    child.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    child.kill()
                    child.wait()
        if self.reference_worker is not None:
            self.reference_worker.__exit__(None, None, None)
        shutil.rmtree(self.work, ignore_errors=True)


def start(
    upstream: str, upstream_calls: str, upstream_http_on: bool, router_args: tuple[str, ...] = ()
) -> Processes:
    """The upstream and a router in front of it (``router_args``: more ``trtfleet router`` flags)."""
    work = Path(tempfile.mkdtemp(prefix="trtfleet-bench-router-"))
    children: list[subprocess.Popen[bytes]] = []
    reference_worker = None
    python = sys.executable
    if upstream == "echo":
        grpc_port, http_port = free_port(), free_port()
        children.append(
            subprocess.Popen(
                [
                    python,
                    "-m",
                    "trtfleet_router.testing.echo",
                    "--port",
                    str(grpc_port),
                    "--http-port",
                    str(http_port),
                    "--host-pages",
                    "64",
                ],
                stdout=subprocess.DEVNULL,
                stderr=(work / "echo.log").open("wb"),
            )
        )
        upstream_grpc, upstream_http, model = f"127.0.0.1:{grpc_port}", f"127.0.0.1:{http_port}", ECHO_MODEL
        upstream_pid = children[-1].pid
        wait_http(f"http://{upstream_http}/v2/health/ready")
        write_adapter(work / "adapter")
        adapter_args = ["--adapter", f"{ADAPTER}={TASK_ID}:{work / 'adapter'}"]
        router_model, task_id, architecture = ADAPTER, TASK_ID, "reference"
    else:
        from trtfleet_engines.reference.workers import running_worker

        reference_worker = running_worker()  # the context manager itself: stop() exits it
        worker = reference_worker.__enter__()
        upstream_grpc, upstream_http, model = worker.grpc_url, worker.http_url, "tensorrt_llm_bls"
        upstream_pid = worker.pid
        upstream_http = upstream_http.removeprefix("http://")
        adapter_args, router_model, task_id, architecture = [], "bench", None, "reference"
    router_http, router_grpc, metrics = free_port(), free_port(), free_port()
    backend = f"{upstream_grpc}//{upstream_http.rsplit(':', 1)[1]}" if upstream_http_on else upstream_grpc
    command = [
        str(Path(python).parent / "trtfleet"), "router", "--host", "127.0.0.1", "--backend", backend,
        "--base-model", "bench", "--architecture", architecture, "--max-input-len", "256", "--max-seq-len", "512",
        *adapter_args, "--http-port", str(router_http), "--grpc-port", str(router_grpc),
        "--metrics-port", str(metrics), "--log-level", "WARNING", "--upstream-calls", upstream_calls,
        "--peer-port", str(free_port()),  # peering on as the chart runs it (no peer here), on a free port
        *router_args,
    ]  # fmt: skip
    router = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=(work / "router.log").open("wb"))
    children.append(router)
    processes = Processes(
        work,
        upstream_grpc,
        upstream_http,
        model,
        task_id,
        router_model,
        f"127.0.0.1:{router_http}",
        f"127.0.0.1:{router_grpc}",
        router.pid,
        upstream_pid,
        children,
        reference_worker,
    )
    try:
        wait_http(f"http://127.0.0.1:{router_http}/v2/health/ready")
    except RuntimeError:
        processes.stop()
        raise
    return processes
