"""Real processes for the routing benchmark: synthetic adapters, reference-engine workers, the router.

* :func:`synthetic_adapters` writes ``count`` PEFT adapters for the reference tiny model (random
  small-norm A/B, rank 8, all seven modules) and converts each with the project's own converter
  (``trtfleet_engines.lora.convert.convert_dir``: ``model.lora_weights.npy`` [1,N,W] fp16,
  ``model.lora_config.npy`` int32 [1,N,3], ``manifest.json``). Cached by (count, seed).
* :class:`RealFleet` starts K real ``tritonserver`` workers on reference repositories with deliberately
  small host LoRA caches, writes a static fleet file and starts ``trtfleet router`` as a subprocess
  with one policy (or ``replicas`` of them on the same fleet file, each with its own ports and log, and
  with ``peer_view`` the peer flags of :func:`bench.replicas.peer_flags`); :meth:`RealFleet.stop` ends
  them all (SIGTERM, then SIGKILL), only the processes it started. A fresh fleet per policy, so every
  policy starts with cold caches.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parent.parent
ADAPTER_CACHE = ROOT / ".cache" / "bench" / "adapters"
HF_MODULES = {
    "self_attn": ("q_proj", "k_proj", "v_proj", "o_proj"),
    "mlp": ("gate_proj", "up_proj", "down_proj"),
}


class FleetStartError(RuntimeError):
    """A worker or the router did not start (with the tail of its log)."""


class PeerViewUnsupported(FleetStartError):
    """The router refused the peer-view flags (``--peer-port``, ``--peer``): it has no peer view yet."""


MODEL_DIR_ENV = "TRTFLEET_BENCH_MODEL_DIR"
"""Overrides the reference model directory (default: the packaged ``assets/tiny-llama``)."""


def model_dir() -> Path:
    from trtfleet_engines.reference.numpy_llama import TINY_LLAMA_DIR

    return Path(os.environ.get(MODEL_DIR_ENV) or TINY_LLAMA_DIR)


def model_dir_with_positions(positions: int, work_dir: Path) -> Path:
    """A copy of the tiny model under ``work_dir`` that takes ``positions`` positions: the same weights (RoPE
    has no learned position table, so only ``max_position_embeddings`` in its config changes)."""
    source = model_dir()
    target = work_dir / f"tiny-{positions}"
    target.mkdir(parents=True, exist_ok=True)
    for item in source.iterdir():
        if item.is_file() and item.name != "config.json":
            shutil.copy2(item, target / item.name)
    config = tiny_config()
    config["max_position_embeddings"] = positions
    (target / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    return target


def tiny_config() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((model_dir() / "config.json").read_text(encoding="utf-8"))
    return data


def _module_shapes(config: dict[str, Any]) -> dict[str, tuple[int, int]]:
    hidden = int(config["hidden_size"])
    inter = int(config["intermediate_size"])
    heads = int(config["num_attention_heads"])
    head_dim = int(config.get("head_dim") or hidden // heads)
    kv = int(config["num_key_value_heads"]) * head_dim
    q = heads * head_dim
    return {
        "q_proj": (hidden, q), "k_proj": (hidden, kv), "v_proj": (hidden, kv), "o_proj": (q, hidden),
        "gate_proj": (hidden, inter), "up_proj": (hidden, inter), "down_proj": (inter, hidden),
    }


def write_peft_adapter(out: Path, config: dict[str, Any], rng: np.random.Generator, rank: int = 8) -> None:
    """A random small-norm PEFT LoRA adapter (what ``peft.get_peft_model`` + training would save)."""
    from safetensors.numpy import save_file

    shapes = _module_shapes(config)
    tensors: dict[str, np.ndarray[Any, Any]] = {}
    for layer in range(int(config["num_hidden_layers"])):
        for block, modules in HF_MODULES.items():
            for module in modules:
                in_dim, out_dim = shapes[module]
                prefix = f"base_model.model.model.layers.{layer}.{block}.{module}"
                tensors[f"{prefix}.lora_A.weight"] = (rng.standard_normal((rank, in_dim)) * 0.02).astype(np.float32)
                tensors[f"{prefix}.lora_B.weight"] = (rng.standard_normal((out_dim, rank)) * 0.02).astype(np.float32)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "adapter_model.safetensors"))
    adapter_config = {
        "peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "lora_dropout": 0.0, "bias": "none",
        "target_modules": [m for modules in HF_MODULES.values() for m in modules], "task_type": "CAUSAL_LM",
    }
    (out / "adapter_config.json").write_text(json.dumps(adapter_config, indent=2), encoding="utf-8")


def synthetic_adapters(count: int, seed: int = 0, root: Path = ADAPTER_CACHE) -> list[Path]:
    """``count`` converted adapters (directories ``s0000`` ...), generated once and reused."""
    from trtfleet_engines.lora.convert import ConversionOptions, convert_dir
    from trtfleet_engines.lora.manifest import MANIFEST_FILE

    config = tiny_config()
    base = root / f"n{count}-seed{seed}"
    paths = [base / f"s{index:04d}" for index in range(count)]
    if all((path / MANIFEST_FILE).is_file() for path in paths):
        return paths
    rng = np.random.default_rng(seed)
    with tempfile.TemporaryDirectory(prefix="trtfleet-peft-") as scratch:
        for index, path in enumerate(paths):
            peft_dir = Path(scratch) / f"p{index}"
            write_peft_adapter(peft_dir, config, rng)
            if not (path / MANIFEST_FILE).is_file():
                convert_dir(peft_dir, path, ConversionOptions(), replace=True)
    return paths


def synthetic_peft_adapters(count: int, seed: int = 0, root: Path = ADAPTER_CACHE) -> list[Path]:
    """``count`` PEFT directories (the same random adapters as :func:`synthetic_adapters`, unconverted):
    what a ``pytorch`` pod reads from ``lora_path``. Generated once and reused."""
    config = tiny_config()
    base = root / f"peft-n{count}-seed{seed}"
    paths = [base / f"s{index:04d}" for index in range(count)]
    if all((path / "adapter_config.json").is_file() for path in paths):
        return paths
    rng = np.random.default_rng(seed)
    for path in paths:
        shutil.rmtree(path, ignore_errors=True)
        write_peft_adapter(path, config, rng)
    return paths


def http_ok(url: str, timeout_s: float = 1.0) -> bool:
    """Whether ``url`` answers 200 now (a readiness probe; any connection error: False)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return bool(response.status == 200)
    except OSError:
        return False


@dataclass
class RealFleet:
    """K reference workers + ``replicas`` router subprocesses with a given policy (one by default)."""

    policy: str
    workers: int
    adapters: Sequence[tuple[str, int, Path]]  # (served name, task id, artifact dir)
    host_cache_bytes: int
    work_dir: Path
    max_batch_size: int = 8
    max_queue_size: int = 64
    min_step_ms: float | None = None
    seed: int = 0
    policy_config: Mapping[str, Any] | None = None  # the router's routing config (YAML keys), e.g. its load bound
    router_args: Sequence[str] = ()  # more ``trtfleet router`` flags (bench.batch: --batch-store ...)
    max_input_len: int | None = None  # the engine's maxInputLen (None: the reference spec's 128)
    prefill_us_per_token: float | None = None  # pretend prefill time per prompt position computed
    kv_max_tokens: int | None = None  # the workers' paged KV cache (None: max batch x max sequence length)
    network_bytes_per_s: float | None = None  # pretend pod network for weights sent with requests (reference loop)
    pcie_bytes_per_s: float | None = None  # pretend host-to-device bandwidth of adapter copies
    replicas: int = 1  # router processes on the same fleet file, as a Deployment's replicas behind a Service
    peer_view: bool = False  # replicas share cache events: each gets --peer-port and a --peer per other
    router_http_ports: list[int] = field(default_factory=list)
    router_metrics_ports: list[int] = field(default_factory=list)
    internal_token: str | None = None  # the peer view's shared token (None: no peer view)
    _workers: list[Any] = field(default_factory=list)
    _routers: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def start(self) -> None:
        from trtfleet_engines.reference.repository import build_reference_repository

        self.work_dir.mkdir(parents=True, exist_ok=True)
        spec = self.spec()
        model = model_dir()
        if spec.engine.max_seq_len > int(tiny_config()["max_position_embeddings"]):
            model = model_dir_with_positions(spec.engine.max_seq_len, self.work_dir)
        try:
            for index in range(self.workers):
                repo = build_reference_repository(
                    self.work_dir / f"repo-w{index}", spec, model_dir=model,
                    lora_cache_host_bytes=self.host_cache_bytes,
                    max_batch_size=self.max_batch_size, max_queue_size=self.max_queue_size,
                    min_step_ms=self.min_step_ms, prefill_us_per_token=self.prefill_us_per_token,
                    kv_max_tokens=self.kv_max_tokens, network_bytes_per_s=self.network_bytes_per_s,
                    pcie_bytes_per_s=self.pcie_bytes_per_s,
                )
                self._workers.append(self._start_worker(repo, index))
            for index in range(self.workers):
                self._workers[index] = self._wait_worker(self._workers[index], index)
            self._start_routers()
        except BaseException:
            self.stop()
            raise

    def _start_worker(self, repo: Path, index: int) -> Any:
        from trtfleet_engines.reference.server import start_worker

        # free ports; wait_ready starts it again on new ones should another process take one first
        return start_worker(repo, log_dir=self.work_dir / f"log-w{index}", wait=False)

    def _wait_worker(self, worker: Any, index: int) -> Any:
        """Wait until ready; a worker that died while starting (rarely, a Python backend stub's shared
        memory lock under heavy CPU contention) is started once more."""
        from trtfleet_engines.reference.errors import WorkerError

        try:
            worker.wait_ready()
            return worker
        except WorkerError:
            repo = worker.repo_dir
            worker.stop()
            retry = self._start_worker(repo, index)
            self._workers[index] = retry
            retry.wait_ready()
            return retry

    def worker_pid(self, index: int) -> int:
        """The process id of worker ``index``'s ``tritonserver`` (its Python-backend stubs are its children)."""
        return int(self._workers[index].process.pid)

    def router_pid(self, index: int = 0) -> int:
        return int(self._routers[index].pid)

    def spec(self) -> Any:
        """The workers' BaseModel spec: the reference one, with ``max_input_len`` (and room for 128 more
        tokens in a sequence) when set."""
        from trtfleet_engines.reference.repository import default_reference_spec

        from trtfleet.api.basemodel import BaseModelSpec

        spec = default_reference_spec()
        if self.max_input_len is None:
            return spec
        data = spec.model_dump(mode="json", by_alias=True, exclude_none=True)
        data["engine"]["maxInputLen"] = self.max_input_len
        data["engine"]["maxSeqLen"] = max(int(data["engine"]["maxSeqLen"]), self.max_input_len + 128)
        return BaseModelSpec.model_validate(data)

    def fleet_config(self) -> dict[str, Any]:
        spec = self.spec().model_dump(mode="json", by_alias=True, exclude_none=True)
        spec["lora"]["cache"]["hostMemoryBytes"] = str(self.host_cache_bytes)
        spec["engine"]["maxBatchSize"] = self.max_batch_size
        spec["serving"]["maxQueueSize"] = self.max_queue_size
        config = tiny_config()  # the dimensions let the router plan the cache geometry, as the operator does
        spec["dimensions"] = {
            "hiddenSize": config["hidden_size"], "intermediateSize": config["intermediate_size"],
            "numLayers": config["num_hidden_layers"], "numAttentionHeads": config["num_attention_heads"],
            "numKvHeads": config["num_key_value_heads"], "vocabSize": config["vocab_size"],
        }
        return {
            "baseModels": [{
                "name": "tiny",
                "spec": spec,
                "architecture": "reference",
                "backends": [
                    {"address": w.grpc_url, "metrics": f"{w.host}:{w.metrics_port}", "podId": f"w{i}"}
                    for i, w in enumerate(self._workers)
                ],
                "adapters": [
                    {"servedName": name, "taskId": task_id, "artifact": str(path)}
                    for name, task_id, path in self.adapters
                ],
            }]
        }

    def _start_routers(self) -> None:
        from trtfleet_engines.reference.server import free_port

        from bench.replicas import peer_flags

        config_path = self.work_dir / "fleet.yaml"
        config_path.write_text(yaml.safe_dump(self.fleet_config(), sort_keys=False), encoding="utf-8")
        base = [
            str(Path(sys.executable).parent / "trtfleet"), "router", "--fleet-config", str(config_path),
            "--policy", self.policy, "--host", "127.0.0.1", "--grpc-port", "-1", "--log-level", "WARNING",
            "--debug-endpoints",  # the counters come from /debug/fleets (loopback clients need no token)
        ]
        if self.policy_config is not None:
            policy_path = self.work_dir / "policy.yaml"
            policy_path.write_text(yaml.safe_dump(dict(self.policy_config), sort_keys=False), encoding="utf-8")
            base += ["--policy-config", str(policy_path)]
        self.router_http_ports = [free_port() for _ in range(self.replicas)]
        self.router_metrics_ports = [free_port() for _ in range(self.replicas)]
        peer_ports = [free_port() for _ in range(self.replicas)] if self.peer_view else []
        token_file = self.work_dir / "internal-tokens"
        if self.peer_view:  # the replicas' shared token, as the chart gives them one; /debug/fleets wants it too
            self.internal_token = secrets.token_urlsafe(32)
            token_file.write_text(self.internal_token + "\n", encoding="utf-8")
        for index in range(self.replicas):
            command = base + [
                "--seed", str(self.seed + index), "--http-port", str(self.router_http_ports[index]),
                "--metrics-port", str(self.router_metrics_ports[index]), *self.router_args,
            ]
            # shadow: each replica its own view (and no fixed peer port for N replicas to collide on)
            command += peer_flags(index, peer_ports, token_file=token_file) if self.peer_view else ["--peer-port", "-1"]
            log = self._router_log(index).open("ab")
            self._routers.append(subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=self.work_dir,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            ))
        deadline = time.monotonic() + 60  # all started before any is awaited: peers find each other
        for index in range(self.replicas):
            self._wait_router(index, deadline)

    def _wait_router(self, index: int, deadline: float) -> None:
        router = self._routers[index]
        while time.monotonic() < deadline:
            if router.poll() is not None:
                tail = self.router_log_tail(index=index)
                if self.peer_view and "unrecognized arguments" in tail:
                    raise PeerViewUnsupported(
                        f"router {index} rejected the peer-view flags --peer-port/--peer: this trtfleet router "
                        f"has no peer view yet (run --view shadow, or a router that has it): {tail}"
                    )
                raise FleetStartError(f"router {index} exited: {tail}")
            if http_ok(f"{self.base_urls[index]}/v1/models"):
                return
            time.sleep(0.1)
        raise FleetStartError(f"router {index} not ready after 60 s: {self.router_log_tail(index=index)}")

    def _router_log(self, index: int) -> Path:
        return self.work_dir / ("router.log" if index == 0 else f"router-{index}.log")

    @property
    def base_urls(self) -> list[str]:
        """Each replica's HTTP base URL, replica 0 first."""
        return [f"http://127.0.0.1:{port}" for port in self.router_http_ports]

    @property
    def base_url(self) -> str:
        return self.base_urls[0]

    @property
    def metrics_url(self) -> str:
        return self.replica_metrics_url(0)

    def replica_metrics_url(self, index: int) -> str:
        return f"http://127.0.0.1:{self.router_metrics_ports[index]}/metrics"

    def router_log_tail(self, size: int = 3000, *, index: int = 0) -> str:
        try:
            return self._router_log(index).read_bytes()[-size:].decode(errors="replace")
        except OSError:
            return ""

    def router_metrics(self, index: int = 0) -> str:
        with urllib.request.urlopen(self.replica_metrics_url(index), timeout=10) as response:
            return str(response.read().decode())

    def fleets_debug(self, index: int = 0) -> Any:
        url = self.replica_metrics_url(index).replace("/metrics", "/debug/fleets")
        headers = {} if self.internal_token is None else {"Authorization": f"Bearer {self.internal_token}"}
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as response:
            return json.loads(response.read().decode())

    def stop(self) -> None:
        routers, self._routers = self._routers, []
        for router in routers:
            if router.poll() is None:
                router.send_signal(signal.SIGTERM)
        for router in routers:
            try:
                router.wait(timeout=20)
            except subprocess.TimeoutExpired:
                router.kill()
                router.wait()
        workers, self._workers = self._workers, []
        for worker in workers:
            worker.stop()

    def __enter__(self) -> RealFleet:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def parse_counters(text: str, name: str) -> float:
    """Sum of every sample of metric family ``name`` (``_total`` added for counters) in exposition text."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        metric = line.split("{", 1)[0].split(" ", 1)[0]
        if metric in (name, f"{name}_total"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def clean(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
