"""Render the five Triton models that serve one TRT-LLM engine, straight from a BaseModel spec.

Pure: :func:`render_configs` maps a spec to ``{model name: config.pbtxt text}``; the only I/O is
:func:`render_model_repository`, which writes those texts (atomically) plus the ``1/`` version dirs.
Nothing is ever left unfilled: there is no template and no ``${...}`` substitution.

Conventions (documented here because the operator and the reference engine rely on them):

* ``tensorrt_llm`` runs the C++ ``tensorrtllm`` backend, or the ``python`` backend for
  ``runtime: reference`` (trtfleet's CPU reference engine). Both get the same inputs, outputs and
  parameters; the reference additionally gets ``reference_model_dir`` (= ``engine_dir``).
* ``tokenizer_dir`` defaults to ``<parent of engine_dir>/tokenizer`` for TRT-LLM engines (the layout the
  build runner publishes) and to ``engine_dir`` itself for the reference engine (whose model directory
  holds its tokenizer).
* LoRA inputs and ``lora_cache_*`` parameters are rendered only when ``spec.lora.enabled``; an engine built
  without the LoRA plugin rejects them anyway, so a client gets Triton's clear "unexpected input" instead.
* ``enable_chunked_context`` / ``enable_kv_cache_reuse`` come from
  :func:`trtfleet_engines.constraints.engine_features` (unset: on when the engine has paged context
  FMHA); when one is off for that reason, a ``#`` comment in the config says which rule.
* ``tokenizer_dir``, ``xgrammar_tokenizer_info_path`` and ``guided_decoding_backend`` are always rendered:
  the C++ backend reads them without a default (the list and its commit: docs/engine-fidelity.md).
* The reference engine's models render no ``dynamic_batching`` block. Triton's batcher
  (``src/dynamic_batch_scheduler.cc``, triton-inference-server/core@73aad7c) wakes on a new request only
  while an instance already waits for work, and a payload's completion callback wakes it before the
  instance is back waiting; a request that comes while the one instance is busy then waits up to the
  batcher's 500 ms idle timeout unless another request follows. The reference engine batches and bounds
  its queue itself (``reference_max_queue_size``); the real backend keeps TRT-LLM's block.
* ``speculative.mode: Medusa`` renders ``decoding_mode: medusa`` and, when given, ``medusa_choices`` (the engine
  overrides the mode anyway; the parameter says what runs). The reference engine gets the LLM-API
  ``speculative_config`` it also reads on its trtllm-serve face, as JSON in ``reference_speculative_config``.
* ``lora_weights`` and the prompt-table tensors carry the engine dtype (TYPE_FP16 or TYPE_BF16) in every
  model, so an ensemble over a bf16 engine type-checks.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path, PurePosixPath

from trtfleet.api.basemodel import BaseModelSpec, BatchSchedulerPolicy, Dtype, Runtime, SpeculativeMode
from trtfleet_engines.constraints import engine_features
from trtfleet_engines.errors import RenderError
from trtfleet_engines.speculation import speculative_config
from trtfleet_engines.storage import write_text_atomic
from trtfleet_engines.triton import pbtxt, tensors
from trtfleet_engines.triton.pbtxt import EnsembleStep, Tensor

logger = logging.getLogger(__name__)

TENSORRT_LLM = "tensorrt_llm"
PREPROCESSING = "preprocessing"
POSTPROCESSING = "postprocessing"
ENSEMBLE = "ensemble"
BLS = "tensorrt_llm_bls"
MODEL_NAMES: tuple[str, ...] = (ENSEMBLE, POSTPROCESSING, PREPROCESSING, TENSORRT_LLM, BLS)

REFERENCE_MODEL_DIR_PARAMETER = "reference_model_dir"
"""Parameter only the reference engine's python ``tensorrt_llm`` model reads: where its model lives."""
REFERENCE_SPECULATIVE_PARAMETER = "reference_speculative_config"
"""The reference engine's speculative decoding: the LLM-API ``speculative_config`` as JSON."""
REFERENCE_MAX_QUEUE_SIZE_PARAMETER = "reference_max_queue_size"
"""The reference engine's queue limit (``serving.maxQueueSize``), which TRT-LLM reads from Triton's
``dynamic_batching.default_queue_policy``: the reference models render no ``dynamic_batching``."""

LOGITS_DATA_TYPE = "TYPE_FP32"
"""trtllm-build's default logits dtype (``--logits_dtype`` is never set by trtfleet)."""

TOKENIZER_INSTANCES_GPU = 4
"""Python tokenizer / detokenizer instances per pod on GPU engines (each is a stub process)."""
BLS_INSTANCES_GPU = 8
"""BLS instances per pod on GPU engines; each decoupled BLS instance drives requests one at a time."""
PYTHON_INSTANCES_REFERENCE = 1
"""Instances of every python model for the CPU reference engine (small machines, two cores)."""

_HEADER = "# Rendered by trtfleet from a BaseModel spec. Do not edit: change the spec and re-render.\n"

_POLICY = {
    BatchSchedulerPolicy.GUARANTEED_NO_EVICT: "guaranteed_no_evict",
    BatchSchedulerPolicy.MAX_UTILIZATION: "max_utilization",
}
_ENGINE_TYPE = {Dtype.FLOAT16: "TYPE_FP16", Dtype.BFLOAT16: "TYPE_BF16"}


def _bool(value: bool) -> str:
    return "true" if value else "false"


def _resolve(items: tuple[Tensor, ...], spec: BaseModelSpec) -> list[Tensor]:
    engine_type = _ENGINE_TYPE[spec.dtype]
    keep_lora = spec.lora.enabled
    return [
        t.resolved(engine_type, LOGITS_DATA_TYPE)
        for t in items
        if keep_lora or t.name not in tensors.LORA_INPUT_NAMES
    ]


def _join(*parts: list[str]) -> str:
    lines: list[str] = []
    for part in parts:
        if part:
            lines += part
    return _HEADER + "\n".join(lines) + "\n"


def _head(
    name: str, spec: BaseModelSpec, *, backend: str | None = None, platform: str | None = None
) -> list[str]:
    lines = [f"name: {pbtxt.quote(name)}"]
    if backend is not None:
        lines.append(f"backend: {pbtxt.quote(backend)}")
    if platform is not None:
        lines.append(f"platform: {pbtxt.quote(platform)}")
    lines.append(f"max_batch_size: {spec.engine.max_batch_size}")
    return lines


def _decoupled() -> list[str]:
    return ["model_transaction_policy { decoupled: true }"]


def _tensorrt_llm(spec: BaseModelSpec, engine_dir: str, tokenizer_dir: str, reference: bool) -> str:
    serving = spec.serving
    features = engine_features(spec)
    params: list[tuple[str, str]] = [
        ("max_beam_width", "1"),
        ("FORCE_CPU_ONLY_INPUT_TENSORS", "no"),
        ("gpt_model_type", "inflight_fused_batching"),
        ("gpt_model_path", engine_dir),
        ("batch_scheduler_policy", _POLICY[serving.batch_scheduler_policy]),
        ("kv_cache_free_gpu_mem_fraction", repr(serving.kv_cache_free_gpu_mem_fraction)),
        ("enable_kv_cache_reuse", _bool(features.kv_cache_reuse)),
        ("enable_chunked_context", _bool(features.chunked_context)),
        ("exclude_input_in_output", "true"),
        # Read without a default by the C++ backend (docs/engine-fidelity.md): empty = no guided decoding.
        ("tokenizer_dir", tokenizer_dir),
        ("xgrammar_tokenizer_info_path", ""),
        ("guided_decoding_backend", ""),
    ]
    if spec.lora.enabled:
        cache = spec.lora.cache
        params += [
            ("lora_cache_optimal_adapter_size", str(cache.optimal_adapter_size)),
            ("lora_cache_max_adapter_size", str(cache.max_adapter_size)),
            ("lora_cache_gpu_memory_fraction", repr(cache.gpu_memory_fraction)),
            ("lora_cache_host_memory_bytes", str(cache.host_bytes)),
        ]
    params += _speculative_parameters(spec, reference)
    if reference:
        params.append((REFERENCE_MODEL_DIR_PARAMETER, engine_dir))
        params.append((REFERENCE_MAX_QUEUE_SIZE_PARAMETER, str(serving.max_queue_size)))
    why = [f"# {reason}" for reason in features.reasons]
    return _join(
        _head(TENSORRT_LLM, spec, backend="python" if reference else "tensorrtllm"),
        why,
        _decoupled(),
        _triton_batcher(spec, reference),
        pbtxt.tensor_list("input", _resolve(tensors.TENSORRT_LLM_INPUTS, spec), is_input=True),
        pbtxt.tensor_list("output", _resolve(tensors.TENSORRT_LLM_OUTPUTS, spec), is_input=False),
        pbtxt.instance_group_cpu(1),
        pbtxt.parameters(params),
    )


def _speculative_parameters(spec: BaseModelSpec, reference: bool) -> list[tuple[str, str]]:
    """``decoding_mode`` / ``medusa_choices`` of a Medusa engine, or the reference engine's speculative config."""
    speculative = spec.speculative
    if speculative is None:
        return []
    if reference:
        config = speculative_config(spec)
        return [(REFERENCE_SPECULATIVE_PARAMETER, json.dumps(config, sort_keys=True, separators=(",", ":")))]
    if speculative.mode is not SpeculativeMode.MEDUSA:
        raise RenderError(f"speculative.mode {speculative.mode.value} has no Triton tensorrt_llm rendering")
    params = [("decoding_mode", "medusa")]
    if speculative.medusa_choices is not None:
        params.append(("medusa_choices", speculative.medusa_choices))
    return params


def _triton_batcher(spec: BaseModelSpec, reference: bool) -> list[str]:
    """The ``dynamic_batching`` block of ``tensorrt_llm`` / ``preprocessing``; none for the reference engine.

    The reference engine's models each run one instance, and Triton's batcher can then hold a request up
    to its 500 ms idle wait (see the module docstring); the reference engine batches in its own loop and
    bounds its own queue (``reference_max_queue_size``).
    """
    if reference:
        return []
    return pbtxt.dynamic_batching(
        max_queue_delay_microseconds=spec.serving.max_queue_delay_microseconds,
        max_queue_size=spec.serving.max_queue_size,
    )


def _preprocessing(
    spec: BaseModelSpec, engine_dir: str, tokenizer_dir: str, instances: int, reference: bool
) -> str:
    return _join(
        _head(PREPROCESSING, spec, backend="python"),
        _triton_batcher(spec, reference),
        pbtxt.tensor_list("input", _resolve(tensors.PREPROCESSING_INPUTS, spec), is_input=True),
        pbtxt.tensor_list("output", _resolve(tensors.PREPROCESSING_OUTPUTS, spec), is_input=False),
        pbtxt.parameters(
            [
                ("tokenizer_dir", tokenizer_dir),
                ("add_special_tokens", "true"),
                ("multimodal_model_path", ""),
                ("gpt_model_path", engine_dir),
            ]
        ),
        pbtxt.instance_group_cpu(instances),
    )


def _postprocessing(spec: BaseModelSpec, tokenizer_dir: str, instances: int, reference: bool) -> str:
    return _join(
        _head(POSTPROCESSING, spec, backend="python"),
        [] if reference else pbtxt.dynamic_batching(),
        pbtxt.tensor_list("input", _resolve(tensors.POSTPROCESSING_INPUTS, spec), is_input=True),
        pbtxt.tensor_list("output", _resolve(tensors.POSTPROCESSING_OUTPUTS, spec), is_input=False),
        pbtxt.parameters([("tokenizer_dir", tokenizer_dir), ("skip_special_tokens", "true")]),
        pbtxt.instance_group_cpu(instances),
    )


def _ensemble(spec: BaseModelSpec) -> str:
    lora = spec.lora.enabled
    llm_inputs = tuple(
        pair for pair in tensors.TENSORRT_LLM_STEP_INPUTS if lora or pair[0] not in tensors.LORA_INPUT_NAMES
    )
    steps = [
        EnsembleStep(PREPROCESSING, tensors.PREPROCESSING_STEP_INPUTS, tensors.PREPROCESSING_STEP_OUTPUTS),
        EnsembleStep(TENSORRT_LLM, llm_inputs, tensors.TENSORRT_LLM_STEP_OUTPUTS),
        EnsembleStep(POSTPROCESSING, tensors.POSTPROCESSING_STEP_INPUTS, tensors.POSTPROCESSING_STEP_OUTPUTS),
    ]
    return _join(
        _head(ENSEMBLE, spec, platform="ensemble"),
        pbtxt.tensor_list("input", _resolve(tensors.ENSEMBLE_INPUTS, spec), is_input=True),
        pbtxt.tensor_list("output", _resolve(tensors.TEXT_OUTPUTS, spec), is_input=False),
        pbtxt.ensemble_scheduling(steps),
    )


def _bls(spec: BaseModelSpec, instances: int) -> str:
    return _join(
        _head(BLS, spec, backend="python"),
        _decoupled(),
        pbtxt.tensor_list("input", _resolve(tensors.BLS_INPUTS, spec), is_input=True),
        pbtxt.tensor_list("output", _resolve(tensors.TEXT_OUTPUTS, spec), is_input=False),
        pbtxt.parameters([("accumulate_tokens", "false"), ("tensorrt_llm_model_name", TENSORRT_LLM)]),
        pbtxt.instance_group_cpu(instances),
    )


def default_tokenizer_dir(engine_dir: str, *, reference: bool) -> str:
    """Where the tokenizer lives when the caller does not say: see the module docstring."""
    if reference:
        return engine_dir
    return str(PurePosixPath(engine_dir).parent / "tokenizer")


def render_configs(
    spec: BaseModelSpec, engine_dir: str, *, tokenizer_dir: str | None = None, reference: bool = False
) -> dict[str, str]:
    """``{model name: config.pbtxt text}`` for the five models serving ``spec``'s engine at ``engine_dir``.

    ``reference`` (or ``spec.runtime == reference``) renders ``tensorrt_llm`` with the python backend.
    """
    if not engine_dir:
        raise RenderError("engine_dir is empty: the tensorrt_llm model needs the engine's directory")
    is_reference = reference or spec.runtime == Runtime.REFERENCE
    tokenizer = tokenizer_dir or default_tokenizer_dir(engine_dir, reference=is_reference)
    tokenizer_instances = PYTHON_INSTANCES_REFERENCE if is_reference else TOKENIZER_INSTANCES_GPU
    bls_instances = PYTHON_INSTANCES_REFERENCE if is_reference else BLS_INSTANCES_GPU
    return {
        ENSEMBLE: _ensemble(spec),
        POSTPROCESSING: _postprocessing(spec, tokenizer, tokenizer_instances, is_reference),
        PREPROCESSING: _preprocessing(spec, engine_dir, tokenizer, tokenizer_instances, is_reference),
        TENSORRT_LLM: _tensorrt_llm(spec, engine_dir, tokenizer, is_reference),
        BLS: _bls(spec, bls_instances),
    }


def render_model_repository(
    spec: BaseModelSpec,
    engine_dir: str,
    out_dir: Path,
    *,
    tokenizer_dir: str | None = None,
    reference: bool | None = None,
) -> list[Path]:
    """Write ``<out_dir>/<model>/config.pbtxt`` and ``<out_dir>/<model>/1/`` for the five models.

    ``reference=None`` follows ``spec.runtime``. Returns the written config files, sorted.
    Python models' ``model.py`` files are not written here: they come from the serving image
    (TRT-LLM's) or from the reference engine package.
    """
    is_reference = spec.runtime == Runtime.REFERENCE if reference is None else reference
    configs = render_configs(spec, engine_dir, tokenizer_dir=tokenizer_dir, reference=is_reference)
    written: list[Path] = []
    for name, text in sorted(configs.items()):
        model_dir = Path(out_dir) / name
        (model_dir / "1").mkdir(parents=True, exist_ok=True)
        path = model_dir / "config.pbtxt"
        write_text_atomic(path, text)
        written.append(path)
    logger.info("rendered Triton model repository %s (engine_dir=%s reference=%s)", out_dir, engine_dir,
                is_reference)
    return written
