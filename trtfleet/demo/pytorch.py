"""``trtfleet demo --runtime pytorch``: reference trtllm-serve workers (``trtfleet worker --runtime pytorch``).

No conversion step: the workers read the sample PEFT directories themselves (``lora_request.lora_path``).
Each worker's device tier holds ``--max-loras`` adapters (default 1) and its host tier
``--adapters-per-worker``, fewer than the demo serves, so a request may wait for a device slot and where
an adapter is warm matters. The router is started once the workers are up, with the tiers the first
worker reports (``/reference/lora_cache``) in its fleet file.
"""

from __future__ import annotations

import argparse
import json
import urllib.request
from pathlib import Path
from typing import Final

import yaml

from trtfleet.demo.errors import StartupError
from trtfleet.demo.fleet import (
    BASE_MODEL,
    ConvertedAdapter,
    ServeTiers,
    WorkerEndpoint,
    build_pytorch_fleet_config,
)
from trtfleet.demo.processes import Child, Supervisor, free_port, trtfleet_command

MAX_LORAS_DEFAULT: Final = 1
HEALTH_PATH: Final = "/health"


def peft_adapters(assets: Path, names: list[str]) -> list[ConvertedAdapter]:
    """The sample PEFT directories as the pytorch runtime serves them (rank and size; nothing converted)."""
    adapters = []
    for name in names:
        path = assets / "adapters" / name
        config = json.loads((path / "adapter_config.json").read_text(encoding="utf-8"))
        adapters.append(ConvertedAdapter(name, path, int(config["r"]), (), (path / "adapter_model.safetensors")
                                         .stat().st_size))
    return adapters


def spawn_worker(sup: Supervisor, args: argparse.Namespace, assets: Path, index: int) -> tuple[WorkerEndpoint, Child]:
    """Worker ``worker-<index>`` (a reference trtllm-serve) on a free port."""
    w = WorkerEndpoint(f"worker-{index}", free_port(), 0, 0)
    argv = [*trtfleet_command(), "worker", "--runtime", "pytorch", "--host", w.host,
            "--http-port", str(w.http_port), "--served-model-name", BASE_MODEL,
            "--model", str(assets / "tiny-llama"), "--max-loras", str(args.max_loras),
            "--max-cpu-loras", str(args.adapters_per_worker)]
    return w, sup.spawn(w.name, argv, restart=True)


def start_workers(sup: Supervisor, args: argparse.Namespace, assets: Path) -> list[tuple[WorkerEndpoint, Child]]:
    return [spawn_worker(sup, args, assets, i + 1) for i in range(args.workers)]


def read_tiers(worker: WorkerEndpoint) -> ServeTiers:
    try:
        with urllib.request.urlopen(f"http://{worker.host}:{worker.http_port}/reference/lora_cache", timeout=10) as r:
            return ServeTiers.from_report(json.loads(r.read()))
    except (OSError, ValueError, KeyError) as exc:
        raise StartupError(f"{worker.name}: no LoRA tiers from /reference/lora_cache: {exc}") from exc


def write_fleet(workdir: Path, workers: list[WorkerEndpoint], adapters: list[ConvertedAdapter]) -> tuple[Path, str]:
    """The router's fleet file, and a line describing the tiers (read from the first worker, and kept for
    rewrites of the file by the demo's autoscaler: :func:`rewrite_fleet`)."""
    tiers = read_tiers(workers[0])
    fleet = workdir / "fleet.yaml"
    fleet.write_text(yaml.safe_dump(build_pytorch_fleet_config(workers, adapters, tiers), sort_keys=False))
    (workdir / "tiers.json").write_text(json.dumps(tiers.__dict__))
    note = (f"LoRA tiers per worker: device {tiers.device_pages} pages, host {tiers.host_pages} pages "
            f"({tiers.pages_per_adapter} pages per adapter; the demo serves {len(adapters)})")
    return fleet, note


def rewrite_fleet(workdir: Path, workers: list[WorkerEndpoint], adapters: list[ConvertedAdapter]) -> None:
    """The fleet file for ``workers`` with the tiers :func:`write_fleet` read (atomic: the router polls it)."""
    tiers = ServeTiers(**json.loads((workdir / "tiers.json").read_text()))
    tmp = workdir / "fleet.yaml.tmp"
    tmp.write_text(yaml.safe_dump(build_pytorch_fleet_config(workers, adapters, tiers), sort_keys=False))
    tmp.replace(workdir / "fleet.yaml")
