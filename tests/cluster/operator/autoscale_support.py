"""What the autoscaling cluster tests share: a real ``trtfleet router`` process with static discovery (base
model ``tiny`` with no pod at first), the echo upstream (a test double of a serving pod: kwok pods serve
nothing), and readers of the operator's logs, events and Deployment."""

from __future__ import annotations

import contextlib
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

import yaml

from tests.cluster.operator.harness import OperatorProcess, example, get, items
from tests.support.controlplane import ControlPlane

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

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    @property
    def demand_url(self) -> str:
        return f"http://127.0.0.1:{self.peer_port}/fleet/v1/demand"

    def set_backends(self, backends: list[dict[str, str]], adapters: list[dict[str, Any]] | None = None) -> None:
        write_fleet(self.fleet_file, backends, adapters)


def write_fleet(path: Path, backends: list[dict[str, str]], adapters: list[dict[str, Any]] | None = None) -> None:
    """Write the router's fleet file (atomically); its static discovery reloads it on change."""
    fleet = {"baseModels": [{"name": "tiny", "architecture": "reference", "maxInputLen": 128,
                             "maxSeqLen": 256, "backends": backends, "adapters": adapters or []}]}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(fleet))
    tmp.replace(path)


def stop_process(process: subprocess.Popen[bytes]) -> None:
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
        stop_process(process)


def echo_upstream() -> tuple[subprocess.Popen[bytes], int]:
    """The echo upstream (a test double of a serving pod: answers ``text``), its gRPC port."""
    echo = subprocess.Popen([sys.executable, "-m", "trtfleet_router.testing.echo", "--port", "0"],
                            stdout=subprocess.PIPE)
    assert echo.stdout is not None
    found = re.search(r":(\d+) \(http", echo.stdout.readline().decode())
    assert found, "the echo upstream did not say its port"
    return echo, int(found.group(1))


def log_lines(operator: OperatorProcess, text: str) -> list[str]:
    return [line for log in operator.logs for line in log.read_text(errors="replace").splitlines() if text in line]


def assert_no_tracebacks(operator: OperatorProcess) -> None:
    assert not log_lines(operator, "Traceback"), operator.log_tail(120)


def events(cp: ControlPlane, ns: str, reason: str) -> list[dict[str, Any]]:
    return [e for e in items(cp, ns, "events") if e.get("reason") == reason
            and e["involvedObject"].get("kind") == "BaseModel"]


def deployment_replicas(cp: ControlPlane, ns: str, name: str) -> tuple[int, int]:
    deployment = get(cp, ns, "deployment", name) or {}
    return int(deployment.get("spec", {}).get("replicas", -1)), int(
        (deployment.get("status") or {}).get("readyReplicas") or 0
    )


def autoscaling_operator(
    cp: ControlPlane, ns: str, tmp_path: Path, router: Router, interval_s: int = 1, *extra: str
) -> OperatorProcess:
    """The operator (started), deciding every ``interval_s`` on the demand ``router``'s /metrics reports."""
    return OperatorProcess(
        cp, ns, tmp_path, extra=("--autoscale-interval", str(interval_s), "--router-metrics-url", router.metrics_url,
                                 *extra),
    ).start()
