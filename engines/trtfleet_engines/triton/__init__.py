"""Triton model repositories for TRT-LLM engines (and the CPU reference engine), rendered from a spec."""

from trtfleet_engines.triton.render import (
    BLS,
    ENSEMBLE,
    MODEL_NAMES,
    POSTPROCESSING,
    PREPROCESSING,
    REFERENCE_MODEL_DIR_PARAMETER,
    TENSORRT_LLM,
    default_tokenizer_dir,
    render_configs,
    render_model_repository,
)

__all__ = [
    "BLS",
    "ENSEMBLE",
    "MODEL_NAMES",
    "POSTPROCESSING",
    "PREPROCESSING",
    "REFERENCE_MODEL_DIR_PARAMETER",
    "TENSORRT_LLM",
    "default_tokenizer_dir",
    "render_configs",
    "render_model_repository",
]
