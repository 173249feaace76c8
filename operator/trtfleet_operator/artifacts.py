"""The convert Job's report: a compact summary of ``manifest.json`` in the termination message (pure).

The convert Job writes :func:`summarize` of the converted adapter's manifest, as one JSON line, to
``/dev/termination-log``; the operator reads it back from the pod status with :func:`parse_summary`.
Kubernetes keeps 4 KiB of a termination message, and the whole manifest (per-layer ranks, file
digests) can be larger, so only what the status needs travels: rank, modules, the weights' sha256 (the
adapter's content identity), the weights' size and the dtype.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

SUMMARY_FORMAT = "trtfleet.convert-summary/v1"
WEIGHTS_FILE = "model.lora_weights.npy"


@dataclass(frozen=True)
class ArtifactSummary:
    rank: int
    modules: tuple[str, ...]
    sha256: str
    weights_bytes: int
    dtype: str

    def to_json(self) -> str:
        return json.dumps(
            {
                "format": SUMMARY_FORMAT,
                "rank": self.rank,
                "modules": list(self.modules),
                "sha256": self.sha256,
                "weightsBytes": self.weights_bytes,
                "dtype": self.dtype,
            },
            sort_keys=True,
            separators=(",", ":"),
        )


class SummaryError(ValueError):
    """A termination message that is not a convert summary."""


def summarize(manifest: Mapping[str, Any]) -> ArtifactSummary:
    """The summary of a ``trtfleet lora convert`` manifest.json."""
    try:
        weights = manifest["outputs"][WEIGHTS_FILE]
        return ArtifactSummary(
            rank=int(manifest["rank"]),
            modules=tuple(sorted(str(m) for m in manifest["modules"])),
            sha256=str(weights["sha256"]),
            weights_bytes=int(manifest["weights_bytes"]),
            dtype=str(manifest["dtype"]),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise SummaryError(f"manifest.json lacks {exc}: not a trtfleet.lora/v1 manifest") from exc


def parse_summary(text: str) -> ArtifactSummary:
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise SummaryError(f"not JSON: {text[:200]!r}") from exc
    if not isinstance(data, dict) or data.get("format") != SUMMARY_FORMAT:
        raise SummaryError(f"not a {SUMMARY_FORMAT} summary: {text[:200]!r}")
    try:
        rank = int(data["rank"])
        modules = tuple(sorted(str(m) for m in data["modules"]))
        if rank < 1 or not modules:
            raise ValueError("rank below 1 or no modules")
        return ArtifactSummary(rank, modules, str(data["sha256"]), int(data["weightsBytes"]), str(data["dtype"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise SummaryError(f"incomplete {SUMMARY_FORMAT} summary ({exc}): {text[:200]!r}") from exc
