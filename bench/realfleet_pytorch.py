"""Real processes for the routing benchmark on the ``pytorch`` runtime: reference trtllm-serve workers.

:class:`ServeFleet` starts K ``python -m trtfleet_engines.reference.serve`` workers (trtllm-serve's
OpenAI contract, adapters read from ``lora_request.lora_path``) with small LoRA tiers (``--max-loras``
device, ``--max-cpu-loras`` host), reads the tiers' pages from the first worker's ``/reference/lora_cache``
(as the operator puts them in ``status.capacity``), writes a static fleet file with ``runtime: pytorch``
and starts ``trtfleet router`` with one policy. Same interface as :class:`bench.realfleet.RealFleet`
where the routing benchmark uses it (``base_url``, ``router_metrics``, ``fleets_debug``, ``stop``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.realfleet import FleetStartError, RealFleet, http_ok, model_dir

STARTUP_TIMEOUT_S = 60.0


@dataclass
class ServeWorker:
    port: int
    process: subprocess.Popen[bytes]
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@dataclass
class ServeFleet(RealFleet):
    """K reference trtllm-serve workers + one router subprocess; ``adapters`` are PEFT directories."""

    max_loras: int = 2
    max_cpu_loras: int = 4
    tiers: Mapping[str, Any] = field(default_factory=dict)  # the first worker's /reference/lora_cache

    def start(self) -> None:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        try:
            self._workers = [self._spawn(index) for index in range(self.workers)]
            for worker in self._workers:
                self._wait(worker)
            with urllib.request.urlopen(self._workers[0].url + "/reference/lora_cache", timeout=10) as response:
                self.tiers = json.loads(response.read().decode())
            self._start_routers()
        except BaseException:
            self.stop()
            raise

    def _spawn(self, index: int) -> ServeWorker:
        from trtfleet_engines.reference.server import free_port
        from trtfleet_engines.reference.threads import one_blas_thread

        port = free_port()
        log = self.work_dir / f"serve-w{index}.log"
        command = [sys.executable, "-m", "trtfleet_engines.reference.serve", str(model_dir()), "--host", "127.0.0.1",
                   "--port", str(port), "--served_model_name", "tiny", "--max_batch_size", str(self.max_batch_size),
                   "--max-queue-size", str(self.max_queue_size), "--max-loras", str(self.max_loras),
                   "--max-cpu-loras", str(self.max_cpu_loras), "--max-lora-rank", "8"]
        if self.min_step_ms is not None:
            command += ["--min-step-ms", str(self.min_step_ms)]
        with log.open("wb") as sink:
            process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                       env=one_blas_thread({**os.environ, "PYTHONUNBUFFERED": "1"}))
        return ServeWorker(port, process, log)

    @staticmethod
    def _wait(worker: ServeWorker) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if worker.process.poll() is not None:
                raise FleetStartError(f"worker exited: {worker.log.read_text(errors='replace')[-3000:]}")
            if http_ok(worker.url + "/health"):
                return
            time.sleep(0.1)
        raise FleetStartError(f"worker not ready after {STARTUP_TIMEOUT_S:.0f} s")

    @property
    def pages_per_adapter(self) -> int:
        return max(1, int(self.tiers["devicePages"]) // max(int(self.tiers["deviceAdapters"]), 1))

    def fleet_config(self) -> dict[str, Any]:
        from trtfleet_engines.reference.repository import default_reference_spec

        engine = default_reference_spec().engine
        return {"baseModels": [{
            "name": "tiny",
            "runtime": "pytorch",
            "architecture": "reference",
            "maxInputLen": engine.max_input_len,
            "maxSeqLen": engine.max_seq_len,
            "hostPages": int(self.tiers["hostPages"]),
            "devicePages": int(self.tiers["devicePages"]),
            "backends": [{"address": f"127.0.0.1:{w.port}", "metrics": f"127.0.0.1:{w.port}", "podId": f"w{i}"}
                         for i, w in enumerate(self._workers)],
            "adapters": [{"servedName": name, "taskId": task_id, "artifact": str(path),
                          "pages": self.pages_per_adapter} for name, task_id, path in self.adapters],
        }]}


def serve_fleet(policy: str, workers: int, adapters: Sequence[tuple[str, int, Path]], work: Path,
                **options: Any) -> ServeFleet:
    return ServeFleet(policy, workers, adapters, 0, work, **options)
