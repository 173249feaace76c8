"""Build a runnable Triton model repository for the CPU reference engine.

The five ``config.pbtxt`` files come from the engines renderer (``render_configs(..., reference=True)``),
so the reference ``tensorrt_llm`` model has the real model's inputs, outputs and parameters. On top of
them this module adds the ``reference_*`` parameters (see :mod:`trtfleet_engines.reference.settings`: the
engine's build options and the pretend GPU) and copies the Python models from ``models/`` into
``<model>/1/`` (with ``_trtfleet_bootstrap.py`` next to each).

Overrides exist for tests, benchmarks and the demo, which want small caches and queues (e.g. a host
tier of 2-3 adapters per worker); each changes the spec before rendering, so the rendered configs stay
exactly what the operator would render for that spec.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from trtfleet.api.basemodel import BaseModelSpec
from trtfleet_engines.reference.errors import RepositoryError

logger = logging.getLogger(__name__)

MODELS_SOURCE_DIR = Path(__file__).resolve().parent / "models"
BOOTSTRAP_FILE = "_trtfleet_bootstrap.py"
PYTHON_MODELS = ("preprocessing", "postprocessing", "tensorrt_llm", "tensorrt_llm_bls")

DEFAULT_REFERENCE_SPEC: Mapping[str, Any] = {
    "source": {"uri": "file:///opt/trtfleet/models/tiny-llama"},
    "architecture": "llama",
    "dtype": "float16",
    "engine": {
        "maxBatchSize": 8,
        "maxInputLen": 128,
        "maxSeqLen": 256,
        "maxNumTokens": 2048,
        "gpu": {"product": "cpu", "count": 1},
    },
    "lora": {
        "enabled": True,
        "maxRank": 8,
        "targetModules": [
            "attn_q",
            "attn_k",
            "attn_v",
            "attn_dense",
            "mlp_h_to_4h",
            "mlp_4h_to_h",
            "mlp_gate",
        ],
        "cache": {
            "gpuMemoryFraction": 0.05,
            "hostMemoryBytes": "2Mi",
            "optimalAdapterSize": 8,
            "maxAdapterSize": 8,
        },
    },
    "serving": {"replicas": 2, "maxQueueSize": 64},
    "runtime": "reference",
}
"""The spec of ``examples/basemodel-reference-tiny.yaml`` (a unit test keeps the two equal)."""

ConfigRenderer = Callable[[BaseModelSpec, str], dict[str, str]]


def default_reference_spec() -> BaseModelSpec:
    return BaseModelSpec.model_validate(DEFAULT_REFERENCE_SPEC)


def default_model_dir() -> Path:
    """The tiny Llama shipped in the package (``assets/tiny-llama``)."""
    from trtfleet_engines.reference.numpy_llama import TINY_LLAMA_DIR

    return TINY_LLAMA_DIR


def lora_cache_bytes_for(
    adapters: int, spec: BaseModelSpec | None = None, *, model_dir: Path | str | None = None
) -> int:
    """A LoRA tier size (bytes) that holds exactly ``adapters`` max-rank adapters over all target modules.

    For ``lora_cache_host_bytes`` / ``lora_cache_device_bytes`` when tests or benchmarks want a cache of
    a few adapters per worker (the sample adapters are max-rank over every target module).
    """
    from trtfleet.loracache import adapter_pages
    from trtfleet_engines.reference.adapters import LoraCacheSettings, plan_cache
    from trtfleet_engines.reference.engine import model_dimensions
    from trtfleet_engines.reference.numpy_llama import LlamaConfig

    spec = spec or default_reference_spec()
    config = LlamaConfig.from_hf_config(Path(model_dir) if model_dir is not None else default_model_dir())
    cache = spec.lora.cache
    settings = LoraCacheSettings(
        target_modules=tuple(spec.lora.target_modules),
        max_lora_rank=spec.lora.max_rank,
        optimal_adapter_size=cache.optimal_adapter_size,
        max_adapter_size=cache.max_adapter_size,
        host_bytes=0,
        device_bytes=0,
        dtype=spec.dtype.value,
    )
    geometry = plan_cache(model_dimensions(config), settings).geometry
    return adapters * adapter_pages(geometry, rank=spec.lora.max_rank) * geometry.page_bytes


def render_with_engines_renderer(spec: BaseModelSpec, engine_dir: str) -> dict[str, str]:
    """The one place the config source is chosen: the engines renderer, in reference mode."""
    from trtfleet_engines.triton import render_configs

    return render_configs(spec, engine_dir, reference=True)


def apply_overrides(
    spec: BaseModelSpec,
    *,
    lora_cache_host_bytes: int | None = None,
    max_batch_size: int | None = None,
    max_num_tokens: int | None = None,
    max_queue_size: int | None = None,
    enable_kv_cache_reuse: bool | None = None,
) -> BaseModelSpec:
    """``spec`` with the given fields replaced (validated again)."""
    data = spec.model_dump(mode="json", by_alias=True, exclude_none=True)
    if lora_cache_host_bytes is not None:
        data["lora"].setdefault("cache", {})["hostMemoryBytes"] = str(int(lora_cache_host_bytes))
    if max_batch_size is not None:
        data["engine"]["maxBatchSize"] = int(max_batch_size)
    if max_num_tokens is not None:
        data["engine"]["maxNumTokens"] = int(max_num_tokens)
    if max_queue_size is not None:
        data["serving"]["maxQueueSize"] = int(max_queue_size)
    if enable_kv_cache_reuse is not None:
        data["serving"]["enableKvCacheReuse"] = bool(enable_kv_cache_reuse)
    return BaseModelSpec.model_validate(data)


def reference_parameters(
    spec: BaseModelSpec,
    *,
    gpu_memory_bytes: int | None = None,
    lora_cache_device_bytes: int | None = None,
    min_step_ms: float | None = None,
    kv_tokens_per_block: int | None = None,
    kv_max_tokens: int | None = None,
    prefill_us_per_token: float | None = None,
    pcie_bytes_per_s: float | None = None,
    network_bytes_per_s: float | None = None,
) -> list[tuple[str, str]]:
    """The ``reference_*`` parameters of the ``tensorrt_llm`` model for ``spec`` (and the KV-cache size,
    TRT-LLM's own ``max_tokens_in_paged_kv_cache``, which the engines renderer does not write)."""
    params = [
        ("reference_dtype", spec.dtype.value),
        ("reference_max_input_len", str(spec.engine.max_input_len)),
        ("reference_max_seq_len", str(spec.engine.max_seq_len)),
        ("reference_max_num_tokens", str(spec.engine.max_num_tokens)),
    ]
    if min_step_ms is not None:
        params.append(("reference_min_step_ms", repr(float(min_step_ms))))
    if prefill_us_per_token is not None:
        params.append(("reference_prefill_us_per_token", repr(float(prefill_us_per_token))))
    if pcie_bytes_per_s is not None:
        params.append(("reference_pcie_bytes_per_s", repr(float(pcie_bytes_per_s))))
    if network_bytes_per_s is not None:
        params.append(("reference_network_bytes_per_s", repr(float(network_bytes_per_s))))
    if kv_tokens_per_block is not None:
        params.append(("reference_tokens_per_block", str(int(kv_tokens_per_block))))
    if kv_max_tokens is not None:
        params.append(("max_tokens_in_paged_kv_cache", str(int(kv_max_tokens))))
    if spec.lora.enabled:
        params += [
            ("reference_max_lora_rank", str(spec.lora.max_rank)),
            ("reference_lora_target_modules", ",".join(m.value for m in spec.lora.target_modules)),
        ]
        if gpu_memory_bytes is not None:
            params.append(("reference_gpu_memory_bytes", str(int(gpu_memory_bytes))))
        if lora_cache_device_bytes is not None:
            params.append(("reference_lora_cache_device_bytes", str(int(lora_cache_device_bytes))))
    return params


def append_parameters(config_text: str, params: list[tuple[str, str]]) -> str:
    """``config_text`` with more ``parameters`` entries (string values) at the end."""
    from trtfleet_engines.triton import pbtxt

    return config_text.rstrip("\n") + "\n" + "\n".join(pbtxt.parameters(params)) + "\n"


def _check_config(name: str, text: str) -> None:
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    try:
        text_format.Parse(text, model_config_pb2.ModelConfig())
    except text_format.ParseError as exc:
        raise RepositoryError(f"rendered config of {name} does not parse: {exc}") from exc


def build_reference_repository(
    out_dir: Path | str,
    spec: BaseModelSpec | None = None,
    *,
    model_dir: Path | str | None = None,
    lora_cache_host_bytes: int | None = None,
    lora_cache_device_bytes: int | None = None,
    gpu_memory_bytes: int | None = None,
    max_batch_size: int | None = None,
    max_num_tokens: int | None = None,
    max_queue_size: int | None = None,
    min_step_ms: float | None = None,
    kv_tokens_per_block: int | None = None,
    kv_max_tokens: int | None = None,
    enable_kv_cache_reuse: bool | None = None,
    prefill_us_per_token: float | None = None,
    renderer: ConfigRenderer | None = None,
    pcie_bytes_per_s: float | None = None,
    network_bytes_per_s: float | None = None,
) -> Path:
    """Write a reference model repository to ``out_dir`` (created; existing models replaced); returns it.

    ``spec`` defaults to the reference tiny model; ``model_dir`` to the packaged tiny Llama.
    ``min_step_ms`` makes every engine step last at least that long (a pretend GPU step time), and
    ``prefill_us_per_token`` that much longer per prompt position it computes (a pretend prefill time);
    ``pcie_bytes_per_s`` and ``network_bytes_per_s`` give adapters' host-to-device copies and weight transfers a
    GPU pod's cost (:mod:`trtfleet_engines.reference.loop`).
    """
    model_path = Path(model_dir) if model_dir is not None else default_model_dir()
    if not (model_path / "config.json").is_file():
        raise RepositoryError(f"{model_path} is not a reference model directory (no config.json)")
    spec = apply_overrides(
        spec or default_reference_spec(),
        lora_cache_host_bytes=lora_cache_host_bytes,
        max_batch_size=max_batch_size,
        max_num_tokens=max_num_tokens,
        max_queue_size=max_queue_size,
        enable_kv_cache_reuse=enable_kv_cache_reuse,
    )
    configs = (renderer or render_with_engines_renderer)(spec, str(model_path.resolve()))
    extra = reference_parameters(
        spec,
        gpu_memory_bytes=gpu_memory_bytes,
        lora_cache_device_bytes=lora_cache_device_bytes,
        min_step_ms=min_step_ms,
        kv_tokens_per_block=kv_tokens_per_block,
        kv_max_tokens=kv_max_tokens,
        prefill_us_per_token=prefill_us_per_token,
        pcie_bytes_per_s=pcie_bytes_per_s,
        network_bytes_per_s=network_bytes_per_s,
    )
    configs["tensorrt_llm"] = append_parameters(configs["tensorrt_llm"], extra)
    out = Path(out_dir)
    for name, text in sorted(configs.items()):
        _check_config(name, text)
        model_root = out / name
        if model_root.exists():
            shutil.rmtree(model_root)
        version_dir = model_root / "1"
        version_dir.mkdir(parents=True)
        (model_root / "config.pbtxt").write_text(text, encoding="utf-8")
        if name in PYTHON_MODELS:
            shutil.copyfile(MODELS_SOURCE_DIR / name / "model.py", version_dir / "model.py")
            shutil.copyfile(MODELS_SOURCE_DIR / BOOTSTRAP_FILE, version_dir / BOOTSTRAP_FILE)
    logger.info("reference repository written to %s (model_dir=%s)", out, model_path)
    return out
