"""``trtfleet demo --runtime tensorrtllm``: reference tritonserver workers (``trtfleet worker``) and the
router's fleet file for them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import yaml

from trtfleet.api import BaseModelSpec
from trtfleet.demo.fleet import ConvertedAdapter, WorkerEndpoint, build_fleet_config
from trtfleet.demo.processes import Child, Supervisor, free_port, trtfleet_command


def spawn_worker(
    sup: Supervisor, basemodel: Path, assets: Path, index: int, say: Callable[[str], None]
) -> tuple[WorkerEndpoint, Child]:
    """Worker ``worker-<index>``: tritonserver with the tiny reference Llama, on free ports."""
    w = WorkerEndpoint(f"worker-{index}", free_port(), free_port(), free_port())
    argv = [*trtfleet_command(), "worker", "--host", w.host, "--http-port", str(w.http_port),
            "--grpc-port", str(w.grpc_port), "--metrics-port", str(w.metrics_port), "--spec", str(basemodel),
            "--model", str(assets / "tiny-llama")]
    say(f"starting {w.name}: tritonserver with the tiny reference Llama (http {w.http_port}, "
        f"grpc {w.grpc_port}, metrics {w.metrics_port})")
    return w, sup.spawn(w.name, argv, restart=True)


def write_fleet(
    fleet: Path, spec: BaseModelSpec, workers: list[WorkerEndpoint], adapters: list[ConvertedAdapter]
) -> None:
    tmp = fleet.with_suffix(".yaml.tmp")  # atomic: the router polls the file
    tmp.write_text(yaml.safe_dump(build_fleet_config(spec, workers, adapters), sort_keys=False))
    tmp.replace(fleet)
