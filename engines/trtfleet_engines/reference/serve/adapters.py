"""PEFT adapters by path, cached by ``lora_int_id`` in two tiers, as TensorRT-LLM's PyTorch backend keeps them.

* **Loading** (:func:`load_peft_adapter`): the PEFT directory is read and converted with the engine tooling's
  own converter (``read_peft_dir`` -> ``parse_peft_adapter`` -> ``convert_adapter``) and parsed into the numpy
  model's :class:`~trtfleet_engines.reference.numpy_lora.AdapterWeights`, exactly as the Triton reference
  engine receives it, so both runtimes give the same greedy outputs. It runs off the event loop, and only when
  the id is not cached: ``lora_int_id`` is the cache key, a cached id ignores the path it comes with.
* **Tiers** (:class:`PeftAdapterStore`, the batcher's ``AdapterCache``): a
  :class:`trtfleet.loracache.LoraPageCache` whose host and device tiers have the pages that
  ``max_cpu_loras`` / ``max_loras`` allocate upstream (:func:`trtfleet_engines.pytorch.capacity.lora_tier`);
  LRU eviction of adapters no request uses; a request whose adapter cannot get device pages waits for a later
  step instead of failing.
* **Admission** (:class:`AdapterGate`): at most as many distinct adapters in flight as the host tier holds
  max-rank adapters; a request with yet another adapter waits before it reaches the engine (upstream's
  scheduler admits a new adapter's context only when its pages fit), so the host tier never runs full.

Errors: :class:`AdapterLoadError` (a path that exists but does not load; the server answers 400
"Failed to load LoRA adapter: ..."); failures inside the engine become the batcher's ``ExecutorRequestFailed``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trtfleet.api.basemodel import LoraModule
from trtfleet.loracache import LoraCacheError, LoraPageCache, adapter_pages, missing_qkv_modules, pages_for_rows
from trtfleet_engines.errors import EnginesError
from trtfleet_engines.lora.convert import ConversionOptions, convert_adapter
from trtfleet_engines.lora.peft import parse_peft_adapter, read_peft_dir
from trtfleet_engines.pytorch.capacity import lora_tier
from trtfleet_engines.reference.adapters import LoraCacheSettings, plan_cache
from trtfleet_engines.reference.engine import model_dimensions
from trtfleet_engines.reference.errors import ExecutorRequestFailed
from trtfleet_engines.reference.numpy_llama import AdapterWeights, LlamaConfig
from trtfleet_engines.reference.scheduler import LoraInputs


class AdapterLoadError(Exception):
    """A PEFT directory that exists but cannot be served by this model (format, modules, rank, dtype)."""


@dataclass(frozen=True)
class LoadedAdapter:
    weights: AdapterWeights
    pages: int
    nbytes: int = 0  # the converted (TRT-LLM layout) weights' bytes: what the host tier stores


@dataclass(frozen=True, eq=False)
class PeftLoraInputs(LoraInputs):
    """A request's ``lora_request``, with the adapter already read when its id was not cached."""

    name: str = ""
    path: str = ""
    loaded: LoadedAdapter | None = None


@dataclass(frozen=True)
class TierSizes:
    max_loras: int
    max_cpu_loras: int
    max_lora_rank: int
    target_modules: tuple[LoraModule, ...]
    optimal_adapter_size: int = 8
    max_adapter_size: int = 64


@dataclass
class CacheEvents:
    """What the cache did, oldest first (served by ``GET /reference/lora_cache``)."""

    loads: list[int] = field(default_factory=list)
    host_evictions: list[int] = field(default_factory=list)
    device_evictions: list[int] = field(default_factory=list)
    device_waits: int = 0
    peak_on_device_busy: int = 0


class PeftAdapterStore:
    """Adapter weights by ``lora_int_id`` in a two-tier page cache. Engine-thread methods are thread-safe."""

    def __init__(self, config: LlamaConfig, sizes: TierSizes, read_bytes_per_s: float = 0.0) -> None:
        """``read_bytes_per_s`` > 0: reading an adapter lasts its converted bytes over it (a pretend volume)."""
        dims = model_dimensions(config)
        self.config = config
        self.sizes = sizes
        settings = LoraCacheSettings(
            target_modules=sizes.target_modules, max_lora_rank=sizes.max_lora_rank,
            optimal_adapter_size=sizes.optimal_adapter_size, max_adapter_size=sizes.max_adapter_size,
            host_bytes=0, device_bytes=0,
        )
        self.geometry = plan_cache(dims, settings).geometry
        self._shapes = {shape.module_id: shape for shape in self.geometry.shapes}
        self.max_adapter_pages = adapter_pages(self.geometry, sizes.max_lora_rank)
        modules = len(sizes.target_modules) + len(missing_qkv_modules(sizes.target_modules))
        self.host = lora_tier(self.geometry, sizes.max_cpu_loras, sizes.max_lora_rank, dims.num_layers, modules)
        self.device = lora_tier(self.geometry, sizes.max_loras, sizes.max_lora_rank, dims.num_layers, modules)
        self.cache = LoraPageCache(self.host.pages, self.device.pages)
        self.events = CacheEvents()
        self._weights: dict[int, AdapterWeights] = {}
        self._lock = threading.Lock()
        self._copied_bytes = 0
        self._read_bytes_per_s = read_bytes_per_s
        self._reading = threading.Lock()  # one read of an adapter directory at a time, as one volume serves it

    @property
    def host_adapters(self) -> int:
        """Max-rank adapters the host tier holds: the bound on distinct adapters in flight."""
        return self.host.pages // self.max_adapter_pages

    @property
    def copied_bytes_total(self) -> int:
        """Bytes copied host -> device so far: the adapter's whole pages each time it was not on the device."""
        with self._lock:
            return self._copied_bytes

    def is_cached(self, task_id: int) -> bool:
        with self._lock:
            return task_id in self.cache

    def load(self, path: str) -> LoadedAdapter:
        """Read and convert the PEFT directory at ``path`` (blocking; call it off the event loop)."""
        options = ConversionOptions(
            dims=model_dimensions(self.config), max_rank=self.sizes.max_lora_rank,
            target_modules=self.sizes.target_modules,
        )
        try:
            converted = convert_adapter(parse_peft_adapter(*read_peft_dir(Path(path))), options)
            weights = AdapterWeights.from_trtllm(converted.weights, converted.config, self.config)
            rows = [(self._shapes[module_id], rank) for module_id, _layer, rank in converted.config[0].tolist()]
            loaded = LoadedAdapter(weights, pages_for_rows(self.geometry, rows), int(converted.weights.nbytes))
        except (EnginesError, OSError, ValueError, KeyError) as exc:
            raise AdapterLoadError(str(exc)) from exc
        if self._read_bytes_per_s > 0:
            with self._reading:  # the pretend volume: the converted bytes at its bandwidth, one read at a time
                time.sleep(loaded.nbytes / self._read_bytes_per_s)
        return loaded

    # -- the batcher's AdapterCache protocol (engine thread) ---------------------------------
    def admit(self, request_id: int, lora: LoraInputs) -> Any:
        if not isinstance(lora, PeftLoraInputs) or lora.task_id is None:
            raise ExecutorRequestFailed(request_id, "lora_request needs lora_int_id and lora_path")
        task_id = lora.task_id
        with self._lock:
            try:
                if task_id not in self.cache:
                    loaded = lora.loaded or self._load_for(request_id, lora.path)  # evicted since it was read
                    for victim in self.cache.put(task_id, loaded.pages):
                        self._weights.pop(victim, None)
                        self.events.host_evictions.append(victim)
                    self._weights[task_id] = loaded.weights
                    self.events.loads.append(task_id)
                self.cache.acquire(task_id)
            except LoraCacheError as exc:
                raise ExecutorRequestFailed(request_id, str(exc)) from exc
            return self._weights[task_id]

    def _load_for(self, request_id: int, path: str) -> LoadedAdapter:
        try:
            return self.load(path)
        except AdapterLoadError as exc:
            raise ExecutorRequestFailed(request_id, f"Failed to load LoRA adapter: {exc}") from exc

    def ensure_device(self, task_id: int) -> bool:
        with self._lock:
            before = list(self.cache.device.idle)  # least recently used first: eviction order
            copy = not self.cache.on_device(task_id)
            placed = self.cache.ensure_device(task_id)
            if copy and placed:
                self._copied_bytes += self.cache.host.pages_of(task_id) * self.geometry.page_bytes
            if not placed:
                self.events.device_waits += 1
            self.events.device_evictions.extend(v for v in before if v not in self.cache.device)
            busy = len(self.cache.device.busy)
            self.events.peak_on_device_busy = max(self.events.peak_on_device_busy, busy)
            return placed

    def release(self, task_id: int) -> None:
        with self._lock:
            self.cache.release(task_id)

    # -- observation ----------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """Residency (least recently used first) and the event history, for ``/reference/lora_cache``."""
        with self._lock:
            return {
                "maxLoras": self.sizes.max_loras,
                "maxCpuLoras": self.sizes.max_cpu_loras,
                "hostPages": self.host.pages,
                "devicePages": self.device.pages,
                "hostAdapters": self.host_adapters,
                "deviceAdapters": self.device.pages // self.max_adapter_pages,
                "hostResident": list(self.cache.resident()),
                "deviceResident": [*self.cache.device.idle, *self.cache.device.busy],
                "loads": list(self.events.loads),
                "hostEvictions": list(self.events.host_evictions),
                "deviceEvictions": list(self.events.device_evictions),
                "deviceWaits": self.events.device_waits,
                "peakDeviceInUse": self.events.peak_on_device_busy,
            }


class AdapterGate:
    """At most ``capacity`` distinct adapters in flight; more wait (event-loop only, not thread-safe)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._in_flight: dict[int, int] = {}
        self._waiters: list[asyncio.Future[None]] = []

    def in_flight(self) -> dict[int, int]:
        return dict(self._in_flight)

    async def acquire(self, task_id: int) -> None:
        while task_id not in self._in_flight and len(self._in_flight) >= self.capacity:
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            finally:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
        self._in_flight[task_id] = self._in_flight.get(task_id, 0) + 1

    def release(self, task_id: int) -> None:
        count = self._in_flight.get(task_id, 0) - 1
        if count > 0:
            self._in_flight[task_id] = count
            return
        self._in_flight.pop(task_id, None)
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)
