"""The LLM-API options YAML of a ``trtllm-serve`` pod (``--config`` / ``--extra_llm_api_options``), from a spec.

Pure: :func:`build_llm_api_options` maps a ``BaseModelSpec`` (and its PyTorch capacity plan, which sizes the
LoRA tiers) to a dict of ``TorchLlmArgs`` keys; :func:`render_llm_api_options` writes it as YAML with sorted
keys, so the same spec always gives the same bytes (golden files: ``tests/golden/pytorch/``).

=============================================  ==============================================================
TorchLlmArgs key (llm_args.py)                 from the spec
=============================================  ==============================================================
``tensor_parallel_size``                       ``parallelism.tensor``
``pipeline_parallel_size``                     ``parallelism.pipeline``
``dtype``                                      ``dtype``
``max_batch_size``                             ``engine.maxBatchSize``
``max_num_tokens``                             ``engine.maxNumTokens``
``max_seq_len``                                ``engine.maxSeqLen``
``kv_cache_config.free_gpu_memory_fraction``   ``serving.kvCacheFreeGpuMemFraction``
``kv_cache_config.enable_block_reuse``         ``serving.enableKvCacheReuse``
``kv_cache_config.dtype``                      ``quantization.kvCacheDtype`` (auto, fp8; int8 is refused)
``enable_chunked_prefill``                     ``serving.enableChunkedContext``
``cuda_graph_config``                          ``{enable_padding: true, max_batch_size: engine.maxBatchSize}``
``lora_config``                                ``lora.*`` (absent when ``lora.enabled`` is false), with
                                               ``max_loras`` / ``max_cpu_loras`` from the capacity plan;
                                               upstream adds missing q/k/v modules itself
``peft_cache_config``                          ``lora.cache.optimalAdapterSize`` / ``maxAdapterSize``
``return_perf_metrics``                        always true: mounts ``/prometheus/metrics``
``enable_iter_perf_stats``                     always true: fills ``/metrics`` and the iteration gauges
``scheduler_config.waiting_queue_policy``      ``serving.waitingQueuePolicy`` (absent when unset: fcfs)
=============================================  ==============================================================

Errors: :class:`~trtfleet_engines.errors.UnsupportedError` for a spec the PyTorch backend cannot run
(an int8 KV cache), :class:`~trtfleet_engines.errors.SpecError` when LoRA is on and the capacity plan has
no LoRA tiers to size ``max_loras`` from.
"""

from __future__ import annotations

from typing import Any

import yaml

from trtfleet.api.basemodel import BaseModelSpec, KvCacheDtype, SpeculativeMode
from trtfleet_engines.errors import SpecError, UnsupportedError
from trtfleet_engines.pytorch.capacity import (
    KV_CACHE_INT8_PROBLEM,
    PytorchCapacityPlan,
    plan_pytorch_capacity,
)
from trtfleet_engines.speculation import speculative_config

OPTIONS_FILE_NAME = "llm-api-options.yaml"
"""The file name the operator mounts and passes to ``trtllm-serve --config``."""
HEADER = "# TensorRT-LLM LLM-API options (TorchLlmArgs), rendered by trtfleet from the BaseModel spec.\n"

_KV_CACHE_DTYPES = {KvCacheDtype.AUTO: "auto", KvCacheDtype.FP8: "fp8"}


def kv_cache_dtype(spec: BaseModelSpec) -> str:
    """``kv_cache_config.dtype`` for the spec (raises UnsupportedError for int8)."""
    wanted = spec.quantization.kv_cache_dtype
    if wanted not in _KV_CACHE_DTYPES:
        raise UnsupportedError(KV_CACHE_INT8_PROBLEM)
    return _KV_CACHE_DTYPES[wanted]


# The engine flow's rules that turn chunked context or block reuse off (engines/trtfleet_engines/constraints.py:
# no paged context FMHA in an engine) have no counterpart on this backend, where LoRA works with both
# (feature-combination-matrix.md, see docs/design/pytorch-backend.md): left unset in the spec, both are on.
UNSET_SERVING_FEATURE = True


def _feature(value: bool | None) -> bool:
    return UNSET_SERVING_FEATURE if value is None else value


OVERLAP_OFF_MODES = frozenset({SpeculativeMode.DRAFT_TARGET, SpeculativeMode.NGRAM})
"""Modes upstream runs with ``disable_overlap_scheduler=True`` (docs/source/features/speculative-decoding.md)."""


def build_llm_api_options(
    spec: BaseModelSpec, capacity: PytorchCapacityPlan | None = None, *, draft_dir: str | None = None
) -> dict[str, Any]:
    """The options as a dict (keys as ``TorchLlmArgs`` spells them). ``capacity`` defaults to planning ``spec``;
    ``draft_dir``: where the prepare Job staged ``speculative.draft`` (required when the mode drafts with a model,
    except for a reference spec's file:// draft)."""
    kv_dtype = kv_cache_dtype(spec)
    options: dict[str, Any] = {
        "tensor_parallel_size": spec.parallelism.tensor,
        "pipeline_parallel_size": spec.parallelism.pipeline,
        "dtype": spec.dtype.value,
        "max_batch_size": spec.engine.max_batch_size,
        "max_num_tokens": spec.engine.max_num_tokens,
        "max_seq_len": spec.engine.max_seq_len,
        "kv_cache_config": {
            "free_gpu_memory_fraction": spec.serving.kv_cache_free_gpu_mem_fraction,
            "enable_block_reuse": _feature(spec.serving.enable_kv_cache_reuse),
            "dtype": kv_dtype,
        },
        "enable_chunked_prefill": _feature(spec.serving.enable_chunked_context),
        "cuda_graph_config": {"enable_padding": True, "max_batch_size": spec.engine.max_batch_size},
        "return_perf_metrics": True,
        "enable_iter_perf_stats": True,
    }
    if spec.lora.enabled:
        plan = capacity if capacity is not None else plan_pytorch_capacity(spec)
        if plan.lora is None:
            raise SpecError("lora.enabled is true but the capacity plan has no LoRA tiers to size max_loras from")
        if plan.lora.max_loras < 1:
            raise SpecError("; ".join(plan.problems) or "the LoRA tiers hold no adapter")
        options["lora_config"] = {
            "lora_ckpt_source": "hf",
            "max_lora_rank": spec.lora.max_rank,
            "max_loras": plan.lora.max_loras,
            "max_cpu_loras": plan.lora.max_cpu_loras,
            "lora_target_modules": [module.value for module in spec.lora.target_modules],
        }
        options["peft_cache_config"] = {
            "optimal_adapter_size": spec.lora.cache.optimal_adapter_size,
            "max_adapter_size": spec.lora.cache.max_adapter_size,
        }
    if spec.serving.waiting_queue_policy is not None:
        options["scheduler_config"] = {"waiting_queue_policy": spec.serving.waiting_queue_policy.value}
    speculative = speculative_config(spec, draft_dir)
    if speculative is not None:
        options["speculative_config"] = speculative
        if spec.speculative is not None and spec.speculative.mode in OVERLAP_OFF_MODES:
            options["disable_overlap_scheduler"] = True
    return options


def render_llm_api_options(
    spec: BaseModelSpec, capacity: PytorchCapacityPlan | None = None, *, draft_dir: str | None = None
) -> str:
    """The options file's text: a header comment, then block YAML with sorted keys."""
    options = build_llm_api_options(spec, capacity, draft_dir=draft_dir)
    body = yaml.safe_dump(options, sort_keys=True, default_flow_style=False)
    return HEADER + body
