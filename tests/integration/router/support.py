"""Helpers: real reference workers (tritonserver + the tiny model) behind an in-process router.

Adapters: the tiny model's sample adapters (``upper``, ``reverse``, ``json``) when the reference
engine ships them, topped up with synthetic random PEFT adapters to ``ADAPTER_COUNT``; all converted
with the project's converter exactly as ``trtfleet lora convert`` does. Each worker's host LoRA cache
holds two adapters, so four adapters over three workers make the router place, evict and miss.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tests.unit.router.harness import LoopThread, RouterThread

ADAPTER_COUNT = 4
CACHE_ADAPTERS_PER_WORKER = 2
WORKERS = 3


@dataclass(frozen=True)
class ConvertedAdapter:
    name: str
    task_id: int
    path: Path

    def weights(self) -> tuple[np.ndarray, np.ndarray]:
        return np.load(self.path / "model.lora_weights.npy"), np.load(self.path / "model.lora_config.npy")


def _write_synthetic_peft(out: Path, seed: int) -> None:
    from safetensors.numpy import save_file
    from trtfleet_engines.reference.numpy_llama import TINY_LLAMA_DIR

    config = json.loads((TINY_LLAMA_DIR / "config.json").read_text())
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    head_dim = config.get("head_dim") or hidden // config["num_attention_heads"]
    q, kv = config["num_attention_heads"] * head_dim, config["num_key_value_heads"] * head_dim
    shapes = {
        "self_attn.q_proj": (hidden, q),
        "self_attn.k_proj": (hidden, kv),
        "self_attn.v_proj": (hidden, kv),
        "self_attn.o_proj": (q, hidden),
        "mlp.gate_proj": (hidden, inter),
        "mlp.up_proj": (hidden, inter),
        "mlp.down_proj": (inter, hidden),
    }
    rng = np.random.default_rng(seed)
    tensors = {}
    for layer in range(config["num_hidden_layers"]):
        for module, (in_dim, out_dim) in shapes.items():
            prefix = f"base_model.model.model.layers.{layer}.{module}"
            tensors[f"{prefix}.lora_A.weight"] = (rng.standard_normal((8, in_dim)) * 0.3).astype(np.float32)
            tensors[f"{prefix}.lora_B.weight"] = (rng.standard_normal((out_dim, 8)) * 0.3).astype(np.float32)
    out.mkdir(parents=True)
    save_file(tensors, str(out / "adapter_model.safetensors"))
    (out / "adapter_config.json").write_text(
        json.dumps(
            {
                "peft_type": "LORA",
                "r": 8,
                "lora_alpha": 16,
                "lora_dropout": 0.0,
                "bias": "none",
                "task_type": "CAUSAL_LM",
                "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
            }
        )
    )


def convert_adapters(root: Path) -> list[ConvertedAdapter]:
    """The sample adapters (topped up with synthetic ones) converted under ``root``."""
    from trtfleet_engines.lora.convert import ConversionOptions, convert_dir
    from trtfleet_engines.reference.numpy_llama import SAMPLE_ADAPTER_NAMES, SAMPLE_ADAPTERS_DIR

    sources = [
        (name, SAMPLE_ADAPTERS_DIR / name)
        for name in SAMPLE_ADAPTER_NAMES
        if (SAMPLE_ADAPTERS_DIR / name / "adapter_config.json").is_file()
    ]
    seed = 0
    while len(sources) < ADAPTER_COUNT:
        peft = root / "peft" / f"synthetic{seed}"
        _write_synthetic_peft(peft, seed)
        sources.append((f"synthetic{seed}", peft))
        seed += 1
    converted = []
    for index, (name, source) in enumerate(sources[:ADAPTER_COUNT], start=1):
        convert_dir(source, root / name, ConversionOptions())
        converted.append(ConvertedAdapter(f"tiny-{name}", 40 + index, root / name))
    return converted


@contextlib.contextmanager
def reference_workers(count: int = WORKERS, **options: Any) -> Iterator[list[Any]]:
    """``count`` tritonserver workers whose host LoRA cache holds two adapters (started in parallel)."""
    from trtfleet_engines.reference.repository import build_reference_repository, lora_cache_bytes_for
    from trtfleet_engines.reference.server import start_worker

    host_bytes = lora_cache_bytes_for(CACHE_ADAPTERS_PER_WORKER)
    scratch = Path(tempfile.mkdtemp(prefix="trtfleet-router-it-"))
    workers: list[Any] = []
    try:
        for index in range(count):
            repo = build_reference_repository(scratch / f"repo{index}", lora_cache_host_bytes=host_bytes, **options)
            workers.append(start_worker(repo, wait=False))  # free ports, retried if another process takes one
        for worker in workers:
            worker.wait_ready()
        yield workers
    finally:
        for worker in workers:
            worker.stop()
        shutil.rmtree(scratch, ignore_errors=True)


def fleet_config(workers: list[Any], adapters: list[ConvertedAdapter]) -> dict[str, Any]:
    from trtfleet_engines.reference.repository import default_reference_spec

    spec = default_reference_spec().model_dump(mode="json", by_alias=True, exclude_none=True)
    return {
        "baseModels": [
            {
                "name": "tiny",
                "spec": spec,
                "hostPages": CACHE_ADAPTERS_PER_WORKER,
                "devicePages": CACHE_ADAPTERS_PER_WORKER,
                "backends": [
                    {
                        "address": w.grpc_url,
                        "metrics": f"{w.host}:{w.metrics_port}",
                        "http": f"{w.host}:{w.http_port}",
                        "podId": f"w{i}",
                    }
                    for i, w in enumerate(workers)
                ],
                "adapters": [
                    {"servedName": a.name, "taskId": a.task_id, "artifact": str(a.path), "pages": 1} for a in adapters
                ],
            }
        ]
    }


@contextlib.contextmanager
def router_for(workers: list[Any], adapters: list[ConvertedAdapter], **settings: Any) -> Iterator[RouterThread]:
    loop = LoopThread()
    router = RouterThread(loop, fleet_config(workers, adapters), **settings)
    try:
        yield router
    finally:
        try:
            router.stop()
        finally:
            loop.close()
