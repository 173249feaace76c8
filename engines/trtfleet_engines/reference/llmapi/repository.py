"""Write the reference llmapi model repository: ``tensorrt_llm/`` with its ``config.pbtxt``, the Python model
and the ``model.yaml`` trtfleet renders for a real pod (:mod:`trtfleet_engines.pytorch.llmapi`), its ``model``
being the tiny Llama directory."""

from __future__ import annotations

import logging
import shutil
from collections.abc import Sequence
from pathlib import Path

import yaml

from trtfleet.api.basemodel import BaseModelSpec
from trtfleet_engines.pytorch.llmapi import MODEL_YAML_NAME, render_llmapi_model_yaml
from trtfleet_engines.reference.errors import RepositoryError
from trtfleet_engines.reference.llmapi.contract import MODEL_NAME, render_config
from trtfleet_engines.reference.repository import BOOTSTRAP_FILE, MODELS_SOURCE_DIR, default_model_dir

logger = logging.getLogger(__name__)

MODEL_SOURCE = MODELS_SOURCE_DIR / "tensorrt_llm_llmapi" / "model.py"


def build_llmapi_repository(
    out_dir: Path | str, spec: BaseModelSpec, *, model_dir: Path | str | None = None, serve_args: Sequence[str] = ()
) -> Path:
    """Write the repository for ``spec`` to ``out_dir`` (an existing ``tensorrt_llm`` is replaced); returns it.

    ``serve_args``: reference-only flags of the ``pytorch`` mode (``--max-loras``, ``--min-step-ms``, ...).
    """
    model_path = Path(model_dir) if model_dir is not None else default_model_dir()
    if not (model_path / "config.json").is_file():
        raise RepositoryError(f"{model_path} is not a reference model directory (no config.json)")
    text = render_llmapi_model_yaml(spec, checkpoint_dir=str(model_path.resolve()))
    config = render_config(yaml.safe_load(text)["triton_config"], serve_args=serve_args)
    root = Path(out_dir) / MODEL_NAME
    if root.exists():
        shutil.rmtree(root)
    version_dir = root / "1"
    version_dir.mkdir(parents=True)
    (root / "config.pbtxt").write_text(config, encoding="utf-8")
    (version_dir / MODEL_YAML_NAME).write_text(text, encoding="utf-8")
    shutil.copyfile(MODEL_SOURCE, version_dir / "model.py")
    shutil.copyfile(MODELS_SOURCE_DIR / BOOTSTRAP_FILE, version_dir / BOOTSTRAP_FILE)
    logger.info("reference llmapi repository written to %s (model_dir=%s)", out_dir, model_path)
    return Path(out_dir)
