"""The demo's fleet, planned as data (pure): the BaseModel the workers serve and the router's fleet file.

One ``BaseModelSpec`` drives both sides, so they cannot disagree: the workers get it as ``--spec``
(their Triton configs and LoRA caches are rendered from it) and the router gets it in its fleet file
(its shadow of each worker's cache is sized from the same spec with the same
:mod:`trtfleet.loracache` geometry). The host LoRA cache is sized to hold ``adapters_per_worker``
of the converted adapters, fewer than the demo serves, so where an adapter is warm matters.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from trtfleet.api import API_VERSION, BaseModelSpec, ModelDimensions
from trtfleet.loracache import LoraCacheConfig, adapter_pages, lora_module_shapes, plan_lora_geometry

BASE_MODEL: Final = "tiny"
SAMPLE_ADAPTERS: Final = ("upper", "reverse", "json")
"""The reference engine's sample adapters, in task-id order (``upper`` is task 1, for ever)."""
ADAPTERS_PER_WORKER_DEFAULT: Final = 2
DTYPE_BYTES: Final = 2  # float16

# The reference BaseModel of examples/basemodel-reference-tiny.yaml, minus the LoRA cache size
# (planned below) and plus the model's dimensions (read from its config.json).
REFERENCE_SPEC: Final[Mapping[str, Any]] = {
    "source": {"uri": "file:///opt/trtfleet/models/tiny-llama"},
    "architecture": "llama",
    "dtype": "float16",
    "engine": {"maxBatchSize": 8, "maxInputLen": 256, "maxSeqLen": 512, "maxNumTokens": 2048,
               "gpu": {"product": "cpu", "count": 1}},
    "lora": {"enabled": True, "maxRank": 8,
             "targetModules": ["attn_q", "attn_k", "attn_v", "attn_dense", "mlp_h_to_4h", "mlp_4h_to_h", "mlp_gate"],
             "cache": {"gpuMemoryFraction": 0.05, "optimalAdapterSize": 8, "maxAdapterSize": 8}},
    "serving": {"maxQueueSize": 64},
    "runtime": "reference",
}


@dataclass(frozen=True)
class ConvertedAdapter:
    """A sample adapter after ``trtfleet lora convert``: what its ``manifest.json`` says."""

    sample: str  # upper | reverse | json
    path: Path
    rank: int
    modules: tuple[str, ...]
    weights_bytes: int

    @property
    def served_name(self) -> str:
        return f"{BASE_MODEL}-{self.sample}"

    @property
    def task_id(self) -> int:
        return SAMPLE_ADAPTERS.index(self.sample) + 1

    @classmethod
    def from_manifest(cls, sample: str, path: Path, manifest: Mapping[str, Any]) -> ConvertedAdapter:
        return cls(sample, path, int(manifest["rank"]), tuple(manifest["modules"]), int(manifest["weights_bytes"]))


@dataclass(frozen=True)
class WorkerEndpoint:
    name: str  # worker-1, worker-2, ...: the router's pod ids
    http_port: int
    grpc_port: int
    metrics_port: int
    host: str = "127.0.0.1"


@dataclass(frozen=True)
class CachePlan:
    pages_per_adapter: int
    host_pages: int
    host_bytes: int


def dimensions_from_config(config: Mapping[str, Any]) -> ModelDimensions:
    """A Llama-family HF ``config.json`` as the API's model dimensions."""
    return ModelDimensions(
        hidden_size=config["hidden_size"],
        intermediate_size=config["intermediate_size"],
        num_layers=config["num_hidden_layers"],
        num_attention_heads=config["num_attention_heads"],
        num_kv_heads=config.get("num_key_value_heads") or config["num_attention_heads"],
        head_dim=config.get("head_dim"),
        vocab_size=config["vocab_size"],
    )


def plan_cache(spec: BaseModelSpec, adapters: Sequence[ConvertedAdapter], adapters_per_worker: int) -> CachePlan:
    """Host-tier bytes that hold ``adapters_per_worker`` of the largest of ``adapters``, in whole pages."""
    if spec.dimensions is None:
        raise ValueError("the demo spec needs the model's dimensions")
    lora = spec.lora
    geometry = plan_lora_geometry(
        lora_module_shapes(spec.dimensions, lora.target_modules, tp=spec.parallelism.tensor),
        LoraCacheConfig(optimal_adapter_size=lora.cache.optimal_adapter_size,
                        max_adapter_size=lora.cache.max_adapter_size, max_lora_rank=lora.max_rank,
                        dtype_bytes=DTYPE_BYTES, num_layers=spec.dimensions.num_layers),
    )
    pages = max(adapter_pages(geometry, a.rank, a.modules) for a in adapters)
    host_pages = pages * max(adapters_per_worker, 1)
    return CachePlan(pages, host_pages, host_pages * geometry.page_bytes)


def plan_spec(
    model_config: Mapping[str, Any], adapters: Sequence[ConvertedAdapter], adapters_per_worker: int
) -> tuple[BaseModelSpec, CachePlan]:
    """The demo's BaseModel spec: the reference tiny model with a LoRA cache sized for the demo."""
    raw = {**REFERENCE_SPEC, "dimensions": dimensions_from_config(model_config).model_dump(by_alias=True)}
    unsized = BaseModelSpec.model_validate(raw)
    cache = plan_cache(unsized, adapters, adapters_per_worker)
    lora = raw["lora"]
    sized = {**raw, "lora": {**lora, "cache": {**lora["cache"], "hostMemoryBytes": cache.host_bytes}}}
    return BaseModelSpec.model_validate(sized), cache


def build_basemodel(spec: BaseModelSpec) -> dict[str, Any]:
    """The whole BaseModel object, as ``trtfleet worker --spec`` reads it."""
    return {"apiVersion": API_VERSION, "kind": "BaseModel", "metadata": {"name": BASE_MODEL},
            "spec": spec.model_dump(mode="json", by_alias=True, exclude_none=True)}


def build_fleet_config(
    spec: BaseModelSpec, workers: Sequence[WorkerEndpoint], adapters: Sequence[ConvertedAdapter]
) -> dict[str, Any]:
    """``trtfleet router --fleet-config`` for the workers and the converted adapters."""
    return {"baseModels": [{
        "name": BASE_MODEL,
        "spec": spec.model_dump(mode="json", by_alias=True, exclude_none=True),
        "backends": [{"address": f"{w.host}:{w.grpc_port}", "metrics": f"{w.host}:{w.metrics_port}",
                      "http": f"{w.host}:{w.http_port}", "podId": w.name} for w in workers],
        "adapters": [{"servedName": a.served_name, "taskId": a.task_id, "artifact": str(a.path)}
                     for a in adapters],
    }]}


# -- runtime pytorch: reference trtllm-serve workers ----------------------------------------------------


@dataclass(frozen=True)
class ServeTiers:
    """A pytorch worker's LoRA tiers as it reports them (``/reference/lora_cache``; on a cluster the
    operator puts the same numbers in ``status.capacity``)."""

    host_pages: int
    device_pages: int
    pages_per_adapter: int  # one adapter of the maximum rank

    @classmethod
    def from_report(cls, report: Mapping[str, Any]) -> ServeTiers:
        device_pages, device_adapters = int(report["devicePages"]), int(report["deviceAdapters"])
        return cls(int(report["hostPages"]), device_pages, max(1, device_pages // max(device_adapters, 1)))


def build_pytorch_fleet_config(
    workers: Sequence[WorkerEndpoint], adapters: Sequence[ConvertedAdapter], tiers: ServeTiers
) -> dict[str, Any]:
    """``trtfleet router --fleet-config`` for reference trtllm-serve workers (OpenAI API on their HTTP
    port, adapters sent as ``lora_request`` with their PEFT directory as ``lora_path``)."""
    return {"baseModels": [{
        "name": BASE_MODEL,
        "runtime": "pytorch",
        "architecture": "reference",
        "maxInputLen": 256,
        "maxSeqLen": 512,
        "hostPages": tiers.host_pages,
        "devicePages": tiers.device_pages,
        "backends": [{"address": f"{w.host}:{w.http_port}", "podId": w.name} for w in workers],
        "adapters": [{"servedName": a.served_name, "taskId": a.task_id, "artifact": str(a.path),
                      "pages": tiers.pages_per_adapter} for a in adapters],
    }]}
