"""``manifest.json`` of a converted adapter: what it is, and the sha256 of every file in and out.

A converted directory holds::

    model.lora_weights.npy   [1, N, W] storage dtype (float16, or bfloat16 bits as |V2)
    model.lora_config.npy    int32 [1, N, 3] rows [module_id, layer_idx, r]
    manifest.json            this record

The manifest is deterministic (no timestamps, sorted keys), so converting the same adapter twice gives
byte-identical directories. ``verify_dir`` re-hashes the outputs and raises ``ManifestMismatchError``
when a file changed; the operator uses the weights sha256 as the adapter's content identity.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

from trtfleet.version import __version__
from trtfleet_engines.lora.errors import AdapterFormatError, ManifestMismatchError
from trtfleet_engines.lora.rows import ConvertedAdapter

MANIFEST_FILE: Final = "manifest.json"
LORA_WEIGHTS_FILE: Final = "model.lora_weights.npy"
LORA_CONFIG_FILE: Final = "model.lora_config.npy"
MANIFEST_FORMAT: Final = "trtfleet.lora/v1"
BFLOAT16_READ_BACK: Final = (
    "bfloat16 bit patterns stored as numpy |V2: bits = np.load(f).view(np.uint16); "
    "float32 = (bits.astype(np.uint32) << 16).view(np.float32)"
)


@dataclass(frozen=True)
class FileDigest:
    sha256: str
    size_bytes: int


@dataclass(frozen=True)
class LoraManifest:
    dtype: str
    storage: str
    rank: int
    ranks: dict[str, int]
    module_shapes: dict[str, list[int]]
    modules: list[str]
    module_ids: list[int]
    layers: list[int]
    num_rows: int
    row_elements: int
    adapter_elements: int
    weights_bytes: int
    use_rslora: bool
    lora_alpha: float
    inputs: dict[str, FileDigest]
    outputs: dict[str, FileDigest]
    adapter_config_sha256: str
    base_config_sha256: str | None = None
    converter: str = f"trtfleet {__version__}"
    format: str = MANIFEST_FORMAT
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any]) -> LoraManifest:
        try:
            data = dict(raw)
            data["inputs"] = {k: FileDigest(**v) for k, v in data["inputs"].items()}
            data["outputs"] = {k: FileDigest(**v) for k, v in data["outputs"].items()}
            return cls(**data)
        except (KeyError, TypeError) as exc:
            raise AdapterFormatError(f"{MANIFEST_FILE} is not a {MANIFEST_FORMAT} manifest: {exc}") from exc


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def digest_file(path: Path) -> FileDigest:
    return FileDigest(sha256=sha256_file(path), size_bytes=path.stat().st_size)


def build_manifest(
    converted: ConvertedAdapter,
    adapter_config: Mapping[str, Any],
    *,
    inputs: Sequence[Path],
    out_dir: Path,
    base_config: Path | None = None,
) -> LoraManifest:
    """The manifest of ``converted`` whose output files are already written in ``out_dir``."""
    ranks: dict[str, int] = {}
    for row in converted.rows:
        ranks[row.module.value] = max(ranks.get(row.module.value, 0), row.rank)
    modules = sorted({row.module for row in converted.rows}, key=lambda m: (m.module_id, m.value))
    digests = {p.name: digest_file(p) for p in inputs}
    return LoraManifest(
        dtype=converted.dtype.value,
        storage="float16" if converted.dtype.value == "float16" else BFLOAT16_READ_BACK,
        rank=max(ranks.values()),
        ranks=dict(sorted(ranks.items())),
        module_shapes={row.module.value: [row.in_dim, row.out_dim] for row in converted.rows},
        modules=[m.value for m in modules],
        module_ids=[m.module_id for m in modules],
        layers=sorted({row.layer for row in converted.rows}),
        num_rows=len(converted.rows),
        row_elements=int(converted.weights.shape[-1]),
        adapter_elements=sum(row.elements for row in converted.rows),
        weights_bytes=int(converted.weights.nbytes),
        use_rslora=bool(adapter_config.get("use_rslora", False)),
        lora_alpha=float(adapter_config.get("lora_alpha", 0.0)),
        inputs=digests,
        outputs={name: digest_file(out_dir / name) for name in (LORA_WEIGHTS_FILE, LORA_CONFIG_FILE)},
        adapter_config_sha256=digests["adapter_config.json"].sha256,
        base_config_sha256=sha256_file(base_config) if base_config is not None else None,
    )


def write_manifest(path: Path, manifest: LoraManifest) -> None:
    with path.open("w", encoding="utf-8") as handle:
        handle.write(manifest.to_json())
        handle.flush()
        os.fsync(handle.fileno())


def read_manifest(out_dir: Path) -> LoraManifest:
    path = out_dir / MANIFEST_FILE
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise AdapterFormatError(f"cannot read {path}: {exc}") from exc
    if not isinstance(raw, dict):
        raise AdapterFormatError(f"{path} is not a JSON object")
    return LoraManifest.from_mapping(raw)


def verify_dir(out_dir: Path, *, source_dir: Path | None = None) -> LoraManifest:
    """Check the outputs (and, given ``source_dir``, the inputs) against the manifest's sha256s."""
    manifest = read_manifest(out_dir)
    checks = [(out_dir / name, digest) for name, digest in manifest.outputs.items()]
    if source_dir is not None:
        checks += [(source_dir / name, digest) for name, digest in manifest.inputs.items()]
    for path, digest in checks:
        if not path.is_file():
            raise ManifestMismatchError(f"{path} is listed in {MANIFEST_FILE} but missing")
        actual = sha256_file(path)
        if actual != digest.sha256:
            raise ManifestMismatchError(f"{path}: sha256 {actual} != {digest.sha256} in {MANIFEST_FILE}")
    return manifest
