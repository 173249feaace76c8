"""The pinned real helm binary for tests (installed by hack/install-helm.sh into .cache/tools)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HELM = ROOT / ".cache" / "tools" / "bin" / "helm"
CHART = ROOT / "charts" / "trtfleet"


def helm_binary() -> Path:
    """Path of the pinned helm, installing it (idempotent) when missing."""
    if not HELM.exists():
        subprocess.run(["bash", str(ROOT / "hack" / "install-helm.sh")], check=True)
    return HELM


def helm(
    *args: str, home: Path, env: dict[str, str] | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run helm with its cache/config/data homes in ``home`` so tests never touch the user's."""
    full_env = {
        **os.environ,
        **(env or {}),
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_DATA_HOME": str(home / "data"),
    }
    return subprocess.run(
        [str(helm_binary()), *args], env=full_env, capture_output=True, text=True, check=check
    )
