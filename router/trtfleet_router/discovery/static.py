"""Static discovery: a fleet file (``--fleet-config fleet.yaml``) or command-line flags.

Fleet file (camelCase or snake_case keys)::

    baseModels:
      - name: tiny
        spec: {...}                 # optional BaseModel spec: limits, dtype, chat template, cache geometry
        architecture: reference     # without spec: llama | mistral | qwen2 | gemma | phi3 | reference
        maxInputLen: 256            # without spec
        maxSeqLen: 512
        hostPages: 4                # LoRA cache pages per pod (else planned from spec, else 8)
        devicePages: 2
        upstreamModel: tensorrt_llm_bls
        chatTemplate: null          # override, see trtfleet_router.chat
        runtime: tensorrtllm        # or pytorch (trtllm-serve pods); default: the spec's, else tensorrtllm
        server: null                # pytorch: triton for Triton's llmapi model (default: the spec's serving.server)
        replaces: null              # a base model this one takes over (a migration; default: the spec's)
        backends:
          - 127.0.0.1:8001/8002/8000                        # Triton gRPC host:port[/metrics[/http]]
          - {address: 127.0.0.1:9001, metrics: 127.0.0.1:9002, http: 127.0.0.1:9000, podId: w2}
        adapters:
          - {servedName: tiny-upper, taskId: 1, artifact: /data/upper, minPods: 0}
        mergedAdapters:             # Adapter mode: merged: pods serving one adapter folded into the weights
          - servedName: tiny-upper  # its requests go there; while none is ready, hot-swapped as above
            backends: [127.0.0.1:9101/9102/9100]
        baseVariants:               # QLoRA: pods of the base dequantized as bitsandbytes does (trtfleet worker
          - name: tiny-q-nf4        # --base-quantization); its adapters are served there and nowhere else
            backends: [127.0.0.1:9201/9202/9200]
            adapters: [{servedName: tiny-upper-qlora, taskId: 9, artifact: /data/upper-nf4}]

Runtime ``pytorch``: a backend's ``address`` is the trtllm-serve HTTP ``host:port``; an adapter's
``artifact`` is its PEFT directory, sent as ``lora_request.lora_path`` (``loraPath`` overrides it
when the pods mount it elsewhere); ``hostPages`` / ``devicePages`` are the tiers of ``max_cpu_loras`` /
``max_loras`` in pages (``trtfleet_engines.pytorch.capacity.lora_tier``, ``status.capacity`` of a
BaseModel). With ``server: triton`` the backends are Triton pods (``address`` the gRPC port) running
TRT-LLM's llmapi model (``upstreamModel`` defaults to ``tensorrt_llm``); adapters travel as ``lora_path``
the same way.

Adapter sizes (``weightsBytes``, rank, modules) come from the artifact's ``manifest.json`` (a PEFT
directory: ``adapter_config.json``'s ``r`` and the weights file's size) when it is a local directory,
else from the entry (``weightsBytes``, ``pages``). Relative paths are relative to the fleet file.
:class:`StaticDiscovery` re-reads the file when its modification time changes.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlparse

import yaml
from pydantic import ValidationError

from trtfleet.api.basemodel import Runtime, WaitingQueuePolicy
from trtfleet.loracache import declared_geometry, pages_for_adapter
from trtfleet_router.chat import chat_renderer
from trtfleet_router.discovery.fleetfile import (
    AdapterConfig as AdapterConfig,
)
from trtfleet_router.discovery.fleetfile import (
    BackendConfig as BackendConfig,
)
from trtfleet_router.discovery.fleetfile import (
    BaseModelConfig as BaseModelConfig,
)
from trtfleet_router.discovery.fleetfile import (
    BaseVariantConfig as BaseVariantConfig,
)
from trtfleet_router.discovery.fleetfile import (
    FleetConfig as FleetConfig,
)
from trtfleet_router.discovery.fleetfile import (
    MergedAdapterConfig as MergedAdapterConfig,
)
from trtfleet_router.discovery.fleetfile import (
    parse_backend as parse_backend,
)
from trtfleet_router.liveview import DiscoverySnapshot, PodEndpoint
from trtfleet_router.models_registry import (
    BYTES_PER_TOKEN_DEFAULT,
    BYTES_PER_TOKEN_REFERENCE,
    DEFAULT_CACHE_PAGES,
    DEFAULT_UPSTREAM_MODEL,
    LLMAPI_UPSTREAM_MODEL,
    AdapterEntry,
    BaseModelEntry,
    EngineLimits,
    ModelRegistry,
    base_entry_from_spec,
    merged_entry,
    variant_entry,
    variant_fleet_name,
)

log = logging.getLogger(__name__)

POLL_INTERVAL_S: Final = 2.0
PEFT_WEIGHT_FILES: Final = ("adapter_model.safetensors", "adapter_model.bin")


def metrics_url(metrics: str | None) -> str | None:
    if metrics is None:
        return None
    if metrics.startswith(("http://", "https://")):
        return metrics
    return f"http://{metrics}/metrics"


def _artifact_dir(uri: str, base_dir: Path | None) -> Path | None:
    parsed = urlparse(uri)
    if parsed.scheme == "file":
        return Path(parsed.path)
    if parsed.scheme:
        return None
    path = Path(uri)
    return path if path.is_absolute() or base_dir is None else base_dir / path


def _peft_manifest(directory: Path) -> dict[str, Any]:
    """``rank`` and ``weights_bytes`` of a PEFT directory (``adapter_config.json`` + weights file)."""
    try:
        config = json.loads((directory / "adapter_config.json").read_text(encoding="utf-8"))
        weights = next((directory / n for n in PEFT_WEIGHT_FILES if (directory / n).is_file()), None)
        size = weights.stat().st_size if weights is not None else 0
    except (OSError, ValueError) as exc:
        log.warning("PEFT adapter unreadable", extra={"ctx": {"dir": str(directory), "error": str(exc)}})
        return {}
    rank = config.get("r") if isinstance(config, dict) else None
    return {"rank": rank, "weights_bytes": size}


def _local_manifest(directory: Path | None) -> dict[str, Any]:
    if directory is None:
        return {}
    if not (directory / "manifest.json").exists() and (directory / "adapter_config.json").exists():
        return _peft_manifest(directory)
    try:
        data = json.loads((directory / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        log.warning("adapter manifest unreadable", extra={"ctx": {"dir": str(directory), "error": str(exc)}})
        return {}
    return data if isinstance(data, dict) else {}


def runtime_of(config: BaseModelConfig) -> Runtime:
    if config.runtime is not None:
        return config.runtime
    return config.spec.runtime if config.spec is not None else Runtime.TENSORRTLLM


def base_entry(config: BaseModelConfig) -> BaseModelEntry:
    server = config.server or (config.spec.serving.server if config.spec is not None else None)
    entry = replace(_base_entry(config), runtime=runtime_of(config), server=server)
    if config.waiting_queue_policy is not None:
        entry = replace(entry, engine_priority=config.waiting_queue_policy is WaitingQueuePolicy.PRIORITY)
    if entry.serves_llmapi:
        upstream = LLMAPI_UPSTREAM_MODEL if entry.upstream_model == DEFAULT_UPSTREAM_MODEL else entry.upstream_model
        entry = replace(entry, upstream_model=upstream, batched=False)
    return entry if config.replaces is None else replace(entry, replaces=config.replaces)


def _base_entry(config: BaseModelConfig) -> BaseModelEntry:
    if config.spec is not None:
        entry = base_entry_from_spec(
            config.name,
            config.spec,
            upstream_model=config.upstream_model,
            host_pages=config.host_pages,
            device_pages=config.device_pages,
        )
        if config.bytes_per_token is not None:
            entry = replace(entry, bytes_per_token=config.bytes_per_token)
        if config.architecture is not None and config.chat_template is None and not config.spec.serving.chat_template:
            entry = replace(entry, architecture=config.architecture, chat=chat_renderer(config.architecture))
        if config.chat_template is not None:
            entry = replace(entry, chat=chat_renderer(entry.architecture, config.chat_template))
        return entry
    architecture = config.architecture or "llama"
    reference = architecture == "reference"
    default_bpt = BYTES_PER_TOKEN_REFERENCE if reference else BYTES_PER_TOKEN_DEFAULT
    host_pages = config.host_pages or DEFAULT_CACHE_PAGES
    return BaseModelEntry(
        name=config.name,
        architecture=architecture,
        limits=EngineLimits(config.max_input_len, config.max_seq_len),
        chat=chat_renderer(architecture, config.chat_template),
        upstream_model=config.upstream_model,
        weights_datatype=config.weights_dtype,
        bytes_per_token=config.bytes_per_token or default_bpt,
        host_pages=host_pages,
        device_pages=config.device_pages or host_pages,
        default_max_tokens=config.default_max_tokens,
    )


def adapter_entry(config: AdapterConfig, base: BaseModelConfig, base_dir: Path | None) -> AdapterEntry:
    directory = _artifact_dir(config.artifact, base_dir)
    manifest = _local_manifest(directory)
    weights_bytes = config.weights_bytes or int(manifest.get("weights_bytes") or 0)
    pages = config.pages
    if pages is None:
        geometry = declared_geometry(base.spec) if base.spec is not None else None
        rank = manifest.get("rank")
        modules = manifest.get("modules")
        pages = pages_for_adapter(
            geometry,
            rank if isinstance(rank, int) else None,
            modules if isinstance(modules, list) else None,
            weights_bytes,
        )
    uri = str(directory) if directory is not None else config.artifact
    lora_path = ""
    if runtime_of(base) is Runtime.PYTORCH:
        lora_path = config.lora_path or uri
    return AdapterEntry(
        served_name=config.served_name,
        base_model=base.name,
        task_id=config.task_id,
        artifact_uri=uri,
        sha256=config.sha256,
        weights_bytes=weights_bytes,
        pages=pages,
        min_pods=config.min_pods,
        lora_path=lora_path,
    )


def snapshot_from_config(config: FleetConfig, base_dir: Path | None = None) -> DiscoverySnapshot:
    bases, adapters, pods = [], [], {}
    for base in config.base_models:
        entry = base_entry(base)
        bases.append(entry)
        adapters += [adapter_entry(a, base, base_dir) for a in base.adapters]
        pods[base.name] = _endpoints(base.backends)
        for merged in base.merged_adapters:
            bases.append(merged_entry(entry, merged.served_name))
            pods[bases[-1].name] = _endpoints(merged.backends)
        for variant in base.base_variants:
            bases.append(variant_entry(entry, variant.name))
            pods[bases[-1].name] = _endpoints(variant.backends)
            fleet = variant_fleet_name(variant.name)
            adapters += [replace(adapter_entry(a, base, base_dir), base_model=fleet) for a in variant.adapters]
    return DiscoverySnapshot(ModelRegistry(bases, adapters), pods)


def _endpoints(backends: Sequence[BackendConfig]) -> dict[str, PodEndpoint]:
    endpoints = {}
    for backend in backends:
        pod_id = backend.pod_id or backend.address
        endpoints[pod_id] = PodEndpoint(
            pod_id=pod_id,
            address=backend.address,
            uid=backend.uid or backend.address,
            metrics_url=metrics_url(backend.metrics),
            http_address=backend.http,
        )
    return endpoints


def load_fleet_config(path: Path) -> FleetConfig:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        return FleetConfig.model_validate(data)
    except (OSError, yaml.YAMLError, ValidationError) as exc:
        raise ValueError(f"invalid fleet configuration {path}: {exc}") from exc


def config_from_flags(
    *,
    base_model: str,
    backends: Sequence[str],
    adapters: Sequence[str],
    architecture: str,
    max_input_len: int,
    max_seq_len: int,
    host_pages: int | None,
    device_pages: int | None,
    upstream_model: str,
) -> FleetConfig:
    """``--backend h:p[/m],... --base-model NAME --adapter name=task_id:artifact_dir ...``"""
    parsed_adapters = []
    for text in adapters:
        name, sep, rest = text.partition("=")
        task, sep2, artifact = rest.partition(":")
        if not (sep and sep2 and name and task.isdigit() and artifact):
            raise ValueError(f"--adapter {text!r}: expected name=task_id:artifact_dir")
        parsed_adapters.append(AdapterConfig(served_name=name, task_id=int(task), artifact=artifact))
    backend_list = [parse_backend(b) for item in backends for b in item.split(",") if b.strip()]
    return FleetConfig(
        base_models=[
            BaseModelConfig(
                name=base_model,
                architecture=architecture,
                max_input_len=max_input_len,
                max_seq_len=max_seq_len,
                host_pages=host_pages,
                device_pages=device_pages,
                upstream_model=upstream_model,
                backends=[BackendConfig(**b) for b in backend_list],
                adapters=parsed_adapters,
            )
        ]
    )


class StaticDiscovery:
    """Applies a fleet file (and re-applies it when it changes) or a fixed config."""

    def __init__(self, *, path: Path | None = None, config: FleetConfig | None = None) -> None:
        if (path is None) == (config is None):
            raise ValueError("give a fleet file or a config")
        self.path = path
        self.config = config
        self._mtime_ns = 0

    def initial(self) -> DiscoverySnapshot:
        if self.path is None:
            assert self.config is not None
            return snapshot_from_config(self.config)
        self._mtime_ns = self.path.stat().st_mtime_ns
        return snapshot_from_config(load_fleet_config(self.path), self.path.parent)

    async def run(self, apply: Callable[[DiscoverySnapshot], None]) -> None:
        """Poll the file; apply a new snapshot when it changed and is valid."""
        if self.path is None:
            return
        while True:
            await asyncio.sleep(POLL_INTERVAL_S)
            try:
                mtime_ns = (await asyncio.to_thread(self.path.stat)).st_mtime_ns
                if mtime_ns == self._mtime_ns:
                    continue
                self._mtime_ns = mtime_ns
                snapshot = await asyncio.to_thread(self.initial)
            except (OSError, ValueError) as exc:
                log.warning("fleet configuration not applied", extra={"ctx": {"error": str(exc)}})
                continue
            apply(snapshot)
            log.info("fleet configuration reloaded", extra={"ctx": {"path": str(self.path)}})
