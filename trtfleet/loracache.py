"""TensorRT-LLM's LoRA cache, as a pure model: page geometry and a two-tier LRU cache.

One implementation serves three callers, so they can never disagree:

* the capacity planners (``trtfleet_engines.capacity``, ``trtfleet_engines.pytorch.capacity``) size tiers
  with :func:`spec_geometry` and :func:`tier_pages`;
* the CPU reference engine uses :class:`LoraPageCache` as its real cache;
* the router keeps one :class:`LoraPageCache` per pod as a shadow of the pod's
  real cache (nothing in Triton exposes it), fed by the requests it sends, and prices an
  adapter in pages of :func:`spec_geometry`.

Geometry (TRT-LLM ``LoraCache``/``PeftCacheManager``, per TP rank, in elements of the
engine dtype): for each enabled module ``m`` let ``d_m = in_m + out_m``.
``page_width = min d_m``; ``optimal = min(optimal_adapter_size, max_lora_rank)``;
``max_a = min(max_adapter_size, max_lora_rank)``;
``slots_per_page = max(optimal * sum_m ceil(d_m / page_width) * layers,
ceil(max_a * max_m d_m / page_width))``. A tier of ``B`` bytes has
``floor(B / (page_width * dtype_bytes))`` slots, i.e. ``ceil(slots / slots_per_page)``
pages. An adapter's rows (one per module and layer) take ``ceil(r * d_m / page_width)``
slots each, packed in order into whole pages that are never shared.

Cache contract (what the router lives by): weights for an unknown id are stored,
evicting least-recently-used *idle* adapters; weights for a cached id are ignored;
an id-only request for an id that is not cached is a miss; with nothing idle to
evict the insert fails (TRT-LLM: ``Cache is full. There are no done tasks to
evict``). Only the host tier decides hits and misses; the device tier only decides
what must be copied before a step runs.

Errors: :class:`LoraCacheError` is the root; :class:`LoraTaskNotFound` (a miss),
:class:`LoraCacheFull` (back-pressure: retry later or elsewhere) and
:class:`LoraAdapterTooLarge` (never fits: a configuration error).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from trtfleet.api.basemodel import LORA_MODULE_IDS, BaseModelSpec, LoraModule, ModelDimensions, Runtime

LORA_DTYPE_BYTES = 2
"""Bytes per element of LoRA weights in the cache: the engine's 16-bit dtype (fp16 or bf16)."""
QKV_MODULES = (LoraModule.ATTN_Q, LoraModule.ATTN_K, LoraModule.ATTN_V)

MISS_TEXT = "LoRA task {task_id} not found in cache. Please send LoRA weights with request"
FULL_TEXT = "Cache is full. There are no done tasks to evict"


class LoraCacheError(Exception):
    """Root of the LoRA cache errors."""


class LoraTaskNotFound(LoraCacheError):
    def __init__(self, task_id: int) -> None:
        super().__init__(MISS_TEXT.format(task_id=task_id))
        self.task_id = task_id


class LoraCacheFull(LoraCacheError):
    def __init__(self, task_id: int) -> None:
        super().__init__(FULL_TEXT)
        self.task_id = task_id


class LoraAdapterTooLarge(LoraCacheError):
    def __init__(self, task_id: int, pages: int, tier_pages: int) -> None:
        super().__init__(
            f"LoRA task {task_id} needs {pages} cache pages but the cache has only {tier_pages}: "
            "raise lora_cache_host_memory_bytes or lower the adapter rank"
        )
        self.task_id = task_id


@dataclass(frozen=True, slots=True)
class LoraModuleShape:
    """One LoRA-targetable linear layer, with TP-local dimensions."""

    name: str
    module_id: int
    in_dim: int
    out_dim: int

    @property
    def row_dim(self) -> int:
        """Elements per rank in one cache row: ``in + out``."""
        return self.in_dim + self.out_dim


def lora_module_shapes(
    dims: ModelDimensions, modules: Iterable[LoraModule], tp: int = 1
) -> tuple[LoraModuleShape, ...]:
    """TP-local (in, out) of each module of a Llama-family model, in the given order.

    As TRT-LLM's runtime sizes them (``loraModule.cpp`` ``createLoraModules``): attn_dense is
    hidden x hidden even where heads x head_dim differs (gemma-7b). Column-parallel layers (q, k, v,
    qkv, h_to_4h, gate, gate_up) split ``out`` over TP ranks; row-parallel layers (dense, 4h_to_h)
    split ``in``.
    """
    head = dims.head_size
    q_out = dims.num_attention_heads * head
    kv_out = dims.num_kv_heads * head
    full: dict[LoraModule, tuple[int, int, bool]] = {
        LoraModule.ATTN_QKV: (dims.hidden_size, q_out + 2 * kv_out, True),
        LoraModule.ATTN_Q: (dims.hidden_size, q_out, True),
        LoraModule.ATTN_K: (dims.hidden_size, kv_out, True),
        LoraModule.ATTN_V: (dims.hidden_size, kv_out, True),
        # loraModule.cpp createLoraModules sizes attn_dense hidden x hidden, whatever heads x head_dim is.
        LoraModule.ATTN_DENSE: (dims.hidden_size, dims.hidden_size, False),
        LoraModule.MLP_H_TO_4H: (dims.hidden_size, dims.intermediate_size, True),
        LoraModule.MLP_GATE: (dims.hidden_size, dims.intermediate_size, True),
        LoraModule.MLP_4H_TO_H: (dims.intermediate_size, dims.hidden_size, False),
        LoraModule.MLP_GATE_UP: (dims.hidden_size, 2 * dims.intermediate_size, True),
    }
    shapes = []
    for module in modules:
        module = LoraModule(module)
        in_dim, out_dim, column = full[module]
        if column:
            out_dim //= tp
        else:
            in_dim //= tp
        shapes.append(LoraModuleShape(module.value, LORA_MODULE_IDS[module], in_dim, out_dim))
    return tuple(shapes)


@dataclass(frozen=True, slots=True)
class LoraCacheConfig:
    optimal_adapter_size: int
    max_adapter_size: int
    max_lora_rank: int
    dtype_bytes: int
    num_layers: int


@dataclass(frozen=True, slots=True)
class LoraGeometry:
    """Page geometry of one engine's LoRA cache (elements of the engine dtype)."""

    page_width: int
    slots_per_page: int
    max_adapter_elements: int
    max_adapter_rank: int
    num_layers: int
    dtype_bytes: int
    shapes: tuple[LoraModuleShape, ...]

    @property
    def page_bytes(self) -> int:
        return self.page_width * self.slots_per_page * self.dtype_bytes

    def row_slots(self, shape: LoraModuleShape, rank: int) -> int:
        return math.ceil(rank * shape.row_dim / self.page_width)


def missing_qkv_modules(targets: Sequence[LoraModule]) -> tuple[LoraModule, ...]:
    """q/k/v modules TRT-LLM's PyTorch backend adds when an adapter targets some but not all of them (zeros)."""
    if not any(module in targets for module in QKV_MODULES):
        return ()
    return tuple(module for module in QKV_MODULES if module not in targets)


def cache_modules(spec: BaseModelSpec) -> tuple[LoraModule, ...]:
    """The modules a pod's LoRA cache holds rows for: the targets, plus (runtime ``pytorch``) the q/k/v modules
    the backend adds."""
    targets = tuple(spec.lora.target_modules)
    if spec.runtime is Runtime.PYTORCH:
        return targets + missing_qkv_modules(targets)
    return targets


def spec_geometry(spec: BaseModelSpec, dims: ModelDimensions) -> LoraGeometry:
    """The LoRA page geometry of one GPU of ``spec``'s pods: TP-local module shapes of :func:`cache_modules`, the
    layers of one pipeline stage, 16-bit weights. The one mapping from a spec to a cache: the planners size tiers
    with it and the router prices adapters with it."""
    shapes = lora_module_shapes(dims, cache_modules(spec), spec.parallelism.tensor)
    config = LoraCacheConfig(
        optimal_adapter_size=spec.lora.cache.optimal_adapter_size,
        max_adapter_size=spec.lora.cache.max_adapter_size,
        max_lora_rank=spec.lora.max_rank,
        dtype_bytes=LORA_DTYPE_BYTES,
        num_layers=math.ceil(dims.num_layers / spec.parallelism.pipeline),
    )
    return plan_lora_geometry(shapes, config)


def declared_geometry(spec: BaseModelSpec) -> LoraGeometry | None:
    """:func:`spec_geometry` from the spec's own ``dimensions`` (what the router knows); None when the spec
    declares none or LoRA is off."""
    if spec.dimensions is None or not spec.lora.enabled:
        return None
    return spec_geometry(spec, spec.dimensions)

def plan_lora_geometry(shapes: Sequence[LoraModuleShape], config: LoraCacheConfig) -> LoraGeometry:
    """TRT-LLM's page geometry for the given modules and cache parameters."""
    if not shapes:
        raise ValueError("a LoRA cache needs at least one target module")
    row_dims = [shape.row_dim for shape in shapes]
    page_width = min(row_dims)
    optimal = min(config.optimal_adapter_size, config.max_lora_rank)
    max_rank = min(config.max_adapter_size, config.max_lora_rank)
    per_layer_slots = sum(math.ceil(d / page_width) for d in row_dims)
    slots_per_page = max(
        optimal * per_layer_slots * config.num_layers,
        math.ceil(max_rank * max(row_dims) / page_width),
    )
    return LoraGeometry(
        page_width=page_width,
        slots_per_page=slots_per_page,
        max_adapter_elements=max_rank * sum(row_dims) * config.num_layers,
        max_adapter_rank=max_rank,
        num_layers=config.num_layers,
        dtype_bytes=config.dtype_bytes,
        shapes=tuple(shapes),
    )


def tier_slots(geometry: LoraGeometry, memory_bytes: int) -> int:
    """Slots (rows of ``page_width`` elements) a tier of ``memory_bytes`` has: ``floor(bytes / row_bytes)``."""
    return memory_bytes // (geometry.page_width * geometry.dtype_bytes)


def tier_pages(geometry: LoraGeometry, memory_bytes: int) -> int:
    """Pages a tier of ``memory_bytes`` holds: ``ceil(floor(bytes / row_bytes) / slots_per_page)``."""
    return math.ceil(tier_slots(geometry, memory_bytes) / geometry.slots_per_page)


def min_tier_slots(geometry: LoraGeometry) -> int:
    """Slots each tier must have or TRT-LLM refuses to start: ``ceil(max adapter elements / page_width)``.

    ``PeftCacheManager::getPageManagerConfig`` checks host and device slots against it ("Not enough space
    allocated to host LoRA cache to hold 1 max sized LoRA").
    """
    return math.ceil(geometry.max_adapter_elements / geometry.page_width)


def min_tier_bytes(geometry: LoraGeometry) -> int:
    """The least memory a tier needs to pass that check: :func:`min_tier_slots` whole rows."""
    return min_tier_slots(geometry) * geometry.page_width * geometry.dtype_bytes


def pages_for_rows(geometry: LoraGeometry, rows: Iterable[tuple[LoraModuleShape, int]]) -> int:
    """Pages taken by rows ``(module, rank)`` packed in order; a row never straddles pages."""
    pages, used = 0, geometry.slots_per_page
    for shape, rank in rows:
        slots = geometry.row_slots(shape, rank)
        if slots > geometry.slots_per_page:
            raise ValueError(
                f"a rank-{rank} row of {shape.name} needs {slots} slots, more than a page's "
                f"{geometry.slots_per_page}: rank above lora_cache_max_adapter_size"
            )
        if used + slots > geometry.slots_per_page:
            pages, used = pages + 1, 0
        used += slots
    return pages


def adapter_pages(geometry: LoraGeometry, rank: int, modules: Iterable[str] | None = None) -> int:
    """Pages one adapter of uniform ``rank`` over ``modules`` (default: all) and all layers takes."""
    wanted = None if modules is None else set(modules)
    shapes = [s for s in geometry.shapes if wanted is None or s.name in wanted]
    rows = [(shape, rank) for _layer in range(geometry.num_layers) for shape in shapes]
    return pages_for_rows(geometry, rows)



def pages_for_adapter(
    geometry: LoraGeometry | None, rank: int | None, modules: Iterable[str] | None, weights_bytes: int
) -> int:
    """Cache pages an adapter takes: exact from the geometry and its rank, else one page per ``page_bytes`` of
    weights, at least one (the geometry is unknown when the spec has no model dimensions)."""
    if geometry is not None and rank is not None:
        try:
            return max(1, adapter_pages(geometry, rank, modules))
        except ValueError:
            return max(1, math.ceil(weights_bytes / geometry.page_bytes))
    if geometry is not None and weights_bytes:
        return max(1, math.ceil(weights_bytes / geometry.page_bytes))
    return 1

class Tier(StrEnum):
    HOST = "host"
    DEVICE = "device"


class _PageTier:
    """Pages of one tier: idle adapters in LRU order, busy ones pinned by a use count."""

    __slots__ = ("busy", "capacity", "idle", "used")

    def __init__(self, capacity_pages: int) -> None:
        self.capacity = capacity_pages
        self.used = 0
        self.idle: OrderedDict[int, int] = OrderedDict()  # task id -> pages, oldest first
        self.busy: dict[int, int] = {}  # task id -> pages

    def __contains__(self, task_id: int) -> bool:
        return task_id in self.idle or task_id in self.busy

    def pages_of(self, task_id: int) -> int:
        return self.idle[task_id] if task_id in self.idle else self.busy[task_id]

    def evictable_pages(self) -> int:
        return sum(self.idle.values())

    def make_room(self, pages: int) -> list[int] | None:
        """Task ids to evict (LRU idle first) so ``pages`` fit, or None if they cannot."""
        free = self.capacity - self.used
        if free >= pages:
            return []
        victims = []
        for task_id, task_pages in self.idle.items():
            victims.append(task_id)
            free += task_pages
            if free >= pages:
                return victims
        return None

    def remove(self, task_id: int) -> None:
        pages = self.idle.pop(task_id, None)
        if pages is None:
            pages = self.busy.pop(task_id)
        self.used -= pages

    def add_idle(self, task_id: int, pages: int) -> None:
        self.idle[task_id] = pages
        self.used += pages


class LoraPageCache:
    """A two-tier (host, device) LoRA cache with TRT-LLM's eviction rules.

    Use counts live on the host tier (a request holds its adapter from admission
    to completion); the device tier pins what the current step uses.
    """

    def __init__(self, host_pages: int, device_pages: int) -> None:
        self.host = _PageTier(host_pages)
        self.device = _PageTier(device_pages)
        self._uses: dict[int, int] = {}
        self.evictions: dict[Tier, int] = {Tier.HOST: 0, Tier.DEVICE: 0}

    # -- queries ---------------------------------------------------------------
    def __contains__(self, task_id: int) -> bool:
        return task_id in self.host

    def on_device(self, task_id: int) -> bool:
        return task_id in self.device

    def in_use(self, task_id: int) -> bool:
        return self._uses.get(task_id, 0) > 0

    def resident(self) -> list[int]:
        """Cached task ids: idle ones least recently used first, then busy ones."""
        return [*self.host.idle, *self.host.busy]

    def can_insert(self, pages: int) -> bool:
        """Whether an adapter of ``pages`` could be stored now (after evicting idle ones)."""
        return pages <= self.host.capacity and self.host.make_room(pages) is not None

    def free_or_evictable_pages(self) -> int:
        return self.host.capacity - self.host.used + self.host.evictable_pages()

    # -- updates ---------------------------------------------------------------
    def put(self, task_id: int, pages: int) -> list[int]:
        """Store weights for ``task_id``; returns the task ids evicted to make room.

        Weights for an id already cached are ignored (and evict nothing).
        """
        if task_id in self.host:
            return []
        if pages > self.host.capacity:
            raise LoraAdapterTooLarge(task_id, pages, self.host.capacity)
        victims = self.host.make_room(pages)
        if victims is None:
            raise LoraCacheFull(task_id)
        for victim in victims:
            self.host.remove(victim)
            if victim in self.device:
                self.device.remove(victim)
            self.evictions[Tier.HOST] += 1
        self.host.add_idle(task_id, pages)
        return victims

    def acquire(self, task_id: int) -> None:
        """A request starts using ``task_id``: pin it. Raises :class:`LoraTaskNotFound` on a miss."""
        if task_id not in self.host:
            raise LoraTaskNotFound(task_id)
        uses = self._uses.get(task_id, 0)
        if uses == 0:
            pages = self.host.idle.pop(task_id)
            self.host.busy[task_id] = pages
        self._uses[task_id] = uses + 1

    def release(self, task_id: int) -> None:
        """A request using ``task_id`` finished; when none is left it becomes the most recent idle entry."""
        uses = self._uses.get(task_id, 0)
        if uses <= 0:
            raise ValueError(f"LoRA task {task_id} released more often than acquired")
        if uses > 1:
            self._uses[task_id] = uses - 1
            return
        del self._uses[task_id]
        pages = self.host.busy.pop(task_id)
        self.host.idle[task_id] = pages
        if task_id in self.device.busy:
            self.device.idle[task_id] = self.device.busy.pop(task_id)
        elif task_id in self.device.idle:
            self.device.idle.move_to_end(task_id)

    def ensure_device(self, task_id: int) -> bool:
        """Copy ``task_id`` to the device tier for a step (evicting idle device entries).

        Returns False when it cannot fit now because every device page is in use:
        the request waits for a later step. The task must be acquired first.
        """
        if task_id not in self.host.busy:
            raise ValueError(f"LoRA task {task_id} must be acquired before it is copied to the device")
        if task_id in self.device:
            if task_id in self.device.idle:
                self.device.busy[task_id] = self.device.idle.pop(task_id)
            return True
        pages = self.host.pages_of(task_id)
        if pages > self.device.capacity:
            raise LoraAdapterTooLarge(task_id, pages, self.device.capacity)
        victims = self.device.make_room(pages)
        if victims is None:
            return False
        for victim in victims:
            self.device.remove(victim)
            self.evictions[Tier.DEVICE] += 1
        self.device.busy[task_id] = pages
        self.device.used += pages
        return True

    def evict(self, task_id: int) -> bool:
        """Drop an idle ``task_id`` (both tiers). Returns False if absent or in use."""
        if task_id not in self.host.idle:
            return False
        self.host.remove(task_id)
        if task_id in self.device:
            self.device.remove(task_id)
        return True

    def clear(self) -> None:
        """Forget everything (a pod restarted)."""
        self.__init__(self.host.capacity, self.device.capacity)  # type: ignore[misc]
