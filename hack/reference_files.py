"""Writing hack/gen_reference_assets.py's outputs: JSON files and whole directories swapped in at once (no
half-written assets), and PEFT adapter directories with a deterministic ``adapter_config.json``."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from peft import PeftModel


def write_json(path: Path, data: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n", encoding="utf-8")
    tmp.replace(path)


def replace_dir(target: Path, build: Callable[[Path], None]) -> None:
    """Build a directory next to ``target`` and swap it in, so no half-written assets are left."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        build(staging)
        staging.chmod(0o755)  # mkdtemp makes 0700; the assets are read by other users in containers
        for file in staging.iterdir():
            file.chmod(0o644)
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    finally:
        if staging.exists():
            shutil.rmtree(staging)


def clean_adapter_config(path: Path, **overrides: object) -> None:
    config = json.loads(path.read_text())
    config["base_model_name_or_path"] = "tiny-llama"
    config.update(overrides)
    if isinstance(config.get("target_modules"), list):  # PEFT writes a set: order varies with PYTHONHASHSEED
        config["target_modules"] = sorted(config["target_modules"])
    write_json(path, dict(sorted(config.items())))


def save_adapter(peft_model: PeftModel, target: Path) -> None:
    def build(out: Path) -> None:
        peft_model.save_pretrained(str(out), safe_serialization=True)
        (out / "README.md").unlink(missing_ok=True)
        clean_adapter_config(out / "adapter_config.json")

    replace_dir(target, build)
