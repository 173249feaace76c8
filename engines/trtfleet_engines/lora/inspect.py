"""What an adapter is and what it costs: ``trtfleet lora inspect DIR``.

Works on a PEFT directory (``adapter_config.json`` + ``adapter_model.safetensors``) and on a converted
one (``model.lora_weights.npy`` + ``model.lora_config.npy``). Reports rank (max and per module),
TRT-LLM modules, layers, rows, elements per row, bytes in the engine dtype, and the LoRA cache pages
the adapter takes (``trtfleet.loracache``: rows packed in order into whole pages). The page geometry
depends on the engine's enabled modules and the base model's dimensions; without them (no
``--base-config``) it is computed from the adapter's own modules and shapes, and the report says so.

Errors: ``trtfleet_engines.lora.errors``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from trtfleet.api.basemodel import LORA_MODULE_IDS, LoraModule, ModelDimensions
from trtfleet.loracache import (
    LoraCacheConfig,
    LoraModuleShape,
    lora_module_shapes,
    pages_for_rows,
    plan_lora_geometry,
)
from trtfleet_engines.lora.convert import DTYPE_BYTES, ConversionOptions, convert_adapter
from trtfleet_engines.lora.errors import AdapterFormatError, TargetModuleError
from trtfleet_engines.lora.manifest import LORA_CONFIG_FILE, LORA_WEIGHTS_FILE, MANIFEST_FILE, read_manifest
from trtfleet_engines.lora.peft import ADAPTER_CONFIG, parse_peft_adapter, read_peft_dir
from trtfleet_engines.lora.rows import LoraRow

_MODULE_BY_ID = {module_id: module for module, module_id in LORA_MODULE_IDS.items()}


@dataclass(frozen=True)
class CacheSettings:
    """The engine's LoRA cache parameters (Triton tensorrt_llm model parameters)."""

    optimal_adapter_size: int = 8
    max_adapter_size: int = 64
    max_lora_rank: int = 64


@dataclass(frozen=True)
class AdapterReport:
    kind: str  # "peft" or "converted"
    rows: tuple[LoraRow, ...]
    row_elements: int  # W: the padded row width
    dtype_bytes: int
    cache_pages: int
    page_width: int
    slots_per_page: int
    geometry_source: str

    @property
    def rank(self) -> int:
        return max(row.rank for row in self.rows)

    @property
    def ranks(self) -> dict[str, int]:
        ranks: dict[str, int] = {}
        for row in self.rows:
            ranks[row.module.value] = max(ranks.get(row.module.value, 0), row.rank)
        return ranks

    @property
    def modules(self) -> list[str]:
        return [m.value for m in sorted({r.module for r in self.rows}, key=lambda m: m.module_id)]

    @property
    def layers(self) -> list[int]:
        return sorted({row.layer for row in self.rows})

    @property
    def adapter_elements(self) -> int:
        return sum(row.elements for row in self.rows)

    @property
    def weights_bytes(self) -> int:
        """Bytes of the padded [1, N, W] tensor sent in a request."""
        return len(self.rows) * self.row_elements * self.dtype_bytes

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "rank": self.rank,
            "ranks": self.ranks,
            "modules": self.modules,
            "layers": self.layers,
            "rows": len(self.rows),
            "row_elements": self.row_elements,
            "adapter_elements": self.adapter_elements,
            "weights_bytes": self.weights_bytes,
            "cache_pages": self.cache_pages,
            "page_width": self.page_width,
            "slots_per_page": self.slots_per_page,
            "geometry_source": self.geometry_source,
        }


def rows_from_trtllm(config: np.ndarray[Any, Any], shapes: Mapping[LoraModule, tuple[int, int]]) -> list[LoraRow]:
    """Rows of a converted adapter's ``lora_config``; ``shapes`` gives each module's (in, out)."""
    rows = config[0] if config.ndim == 3 else config
    if rows.ndim != 2 or rows.shape[1] != 3:
        raise AdapterFormatError(f"{LORA_CONFIG_FILE} has shape {config.shape}, expected [1, N, 3]")
    out = []
    for module_id, layer, rank in rows.tolist():
        if module_id not in _MODULE_BY_ID:
            raise AdapterFormatError(f"{LORA_CONFIG_FILE}: module id {module_id} is not a known LoRA module")
        module = _MODULE_BY_ID[module_id]
        if module not in shapes:
            raise AdapterFormatError(f"no dimensions for module {module.value}: pass --base-config")
        in_dim, out_dim = shapes[module]
        out.append(LoraRow(module, int(layer), int(rank), in_dim, out_dim))
    return out


def _converted_shapes(path: Path, dims: ModelDimensions | None) -> dict[LoraModule, tuple[int, int]]:
    """Module (in, out) from the base model's dimensions, else from the converted dir's manifest."""
    if dims is not None:
        return {LoraModule(s.name): (s.in_dim, s.out_dim) for s in lora_module_shapes(dims, list(LoraModule))}
    if not (path / MANIFEST_FILE).is_file():
        raise AdapterFormatError(f"{path} has no {MANIFEST_FILE}: pass --base-config to give the model's dimensions")
    manifest = read_manifest(path)
    return {LoraModule(name): (int(shape[0]), int(shape[1])) for name, shape in manifest.module_shapes.items()}


def _geometry_shapes(
    rows: Sequence[LoraRow], dims: ModelDimensions | None, target_modules: Sequence[LoraModule] | None
) -> tuple[list[LoraModuleShape], str]:
    if dims is not None:
        modules = (
            list(target_modules) if target_modules else sorted({r.module for r in rows}, key=lambda m: m.module_id)
        )
        missing = {r.module for r in rows} - set(modules)
        if missing:
            raise TargetModuleError(f"adapter modules {sorted(m.value for m in missing)} not enabled for this model")
        return list(lora_module_shapes(dims, modules)), "base model dimensions"
    seen: dict[LoraModule, LoraModuleShape] = {}
    for row in rows:
        seen.setdefault(row.module, LoraModuleShape(row.module.value, row.module_id, row.in_dim, row.out_dim))
    return list(seen.values()), "the adapter's own modules (no --base-config: the engine's modules may differ)"


def report(
    rows: Sequence[LoraRow],
    *,
    kind: str,
    row_elements: int,
    num_layers: int,
    settings: CacheSettings,
    dims: ModelDimensions | None = None,
    target_modules: Sequence[LoraModule] | None = None,
) -> AdapterReport:
    """Sizes and cache pages of an adapter's rows (pure)."""
    shapes, source = _geometry_shapes(rows, dims, target_modules)
    geometry = plan_lora_geometry(
        shapes,
        LoraCacheConfig(
            optimal_adapter_size=settings.optimal_adapter_size,
            max_adapter_size=settings.max_adapter_size,
            max_lora_rank=settings.max_lora_rank,
            dtype_bytes=DTYPE_BYTES,
            num_layers=num_layers,
        ),
    )
    by_name = {shape.name: shape for shape in shapes}
    pages = pages_for_rows(geometry, [(by_name[row.module.value], row.rank) for row in rows])
    return AdapterReport(
        kind=kind,
        rows=tuple(rows),
        row_elements=row_elements,
        dtype_bytes=DTYPE_BYTES,
        cache_pages=pages,
        page_width=geometry.page_width,
        slots_per_page=geometry.slots_per_page,
        geometry_source=source,
    )


def inspect_dir(
    path: Path,
    *,
    settings: CacheSettings | None = None,
    dims: ModelDimensions | None = None,
    target_modules: Sequence[LoraModule] | None = None,
) -> AdapterReport:
    """Report on a PEFT or a converted adapter directory (I/O shell around ``report``)."""
    settings = settings or CacheSettings()
    if (path / LORA_CONFIG_FILE).is_file():
        try:
            config = np.load(path / LORA_CONFIG_FILE, allow_pickle=False)
            weights = np.load(path / LORA_WEIGHTS_FILE, mmap_mode="r", allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise AdapterFormatError(f"cannot read the converted adapter in {path}: {exc}") from exc
        row_elements = int(weights.shape[-1])
        rows = rows_from_trtllm(config, _converted_shapes(path, dims))
        kind = "converted"
    elif (path / ADAPTER_CONFIG).is_file():
        adapter = parse_peft_adapter(*read_peft_dir(path))
        all_modules = tuple(LoraModule)
        converted = convert_adapter(adapter, ConversionOptions(target_modules=all_modules, max_rank=1 << 30))
        rows, row_elements, kind = list(converted.rows), int(converted.weights.shape[-1]), "peft"
    else:
        raise AdapterFormatError(f"{path} holds neither a PEFT adapter nor {LORA_CONFIG_FILE}")
    num_layers = dims.num_layers if dims is not None else max(row.layer for row in rows) + 1
    return report(
        rows,
        kind=kind,
        row_elements=row_elements,
        num_layers=num_layers,
        settings=settings,
        dims=dims,
        target_modules=target_modules,
    )


def format_report(result: AdapterReport) -> str:
    data = result.to_dict()
    ranks = ", ".join(f"{name} {rank}" for name, rank in data["ranks"].items())
    layers = data["layers"]
    return "\n".join(
        [
            f"kind:            {data['kind']}",
            f"rank:            {data['rank']} ({ranks})",
            f"modules:         {' '.join(data['modules'])}",
            f"layers:          {layers[0]}-{layers[-1]} ({len(layers)})",
            f"rows:            {data['rows']} x {data['row_elements']} elements (padded), "
            f"{data['adapter_elements']} elements unpadded",
            f"weights bytes:   {data['weights_bytes']} (2-byte engine dtype)",
            f"lora cache:      {data['cache_pages']} page(s) of {data['slots_per_page']} slots x "
            f"{data['page_width']} elements (geometry from {data['geometry_source']})",
        ]
    )
