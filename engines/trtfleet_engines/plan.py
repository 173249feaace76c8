"""BaseModel spec -> engine build plan (exact argv of every step) and the engine's content address.

Pure: no file system, no clock. :func:`plan_engine_build` returns a frozen :class:`BuildPlan` whose steps
are data; :mod:`trtfleet_engines.runner` executes them. Steps, in order:

1. ``fetch`` - make the HF checkpoint readable: hf:// and s3:// are downloaded into ``<workdir>/source``,
   pvc:// is read in place under :data:`PVC_MOUNT_ROOT` (the build Job mounts the claim there), file:// in
   place.
2. (merged adapters only) ``fetch-adapter`` and ``merge-lora`` (``trtfleet lora merge``); (QLoRA base
   variants only) ``dequantize-base`` (``trtfleet lora base-variant``: every decoder linear weight quantized and
   dequantized as bitsandbytes does, :mod:`trtfleet_engines.lora.qlora_base`).
3. ``convert-checkpoint`` (the architecture's ``convert_checkpoint.py``) or ``quantize`` (TRT-LLM's
   ``examples/quantization/quantize.py``, for fp8, int4_awq, an fp8 KV cache, or an int8 KV cache on a
   converter without ``--int8_kv_cache``) into ``<workdir>/checkpoint``; with ``speculative.mode: Medusa``,
   ``fetch-draft`` (the heads, into ``<workdir>/draft``) and ``examples/medusa/convert_checkpoint.py``, which
   writes one checkpoint of the model and its heads.
4. ``trtllm-build`` into ``<workdir>/engine`` (Medusa: ``--speculative_decoding_mode medusa --max_draft_len``).
5. ``stage`` - copy the tokenizer and render the Triton model repository (done by the runner itself).

The reference runtime has no conversion: ``fetch`` then ``stage``, which copies the whole model; a merged
adapter's plan merges first keeping the base dtype (``--dtype base``: the reference engine computes in
float32), which is also what ``trtfleet worker --merged-adapter`` does when it starts.

The engine hash is sha256 over canonical JSON of everything that makes engines differ (see
:func:`engine_identity`); serving knobs, replicas, ``lora.cache``, ``runtime`` and ``secretRef`` are
deliberately left out, and the GPU product counts only through its SM architecture. ``spec.speculative``, when set,
is hashed whole (the draft's source included): it changes the engine or what the pods serve.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

from trtfleet.api.adapter import BaseQuantizationSpec
from trtfleet.api.basemodel import (
    Architecture,
    BaseModelSpec,
    KvCacheDtype,
    LoraModule,
    LoraSpec,
    QuantizationMode,
    Runtime,
    SpeculativeMode,
)
from trtfleet_engines.buildplan import PLAN_FORMAT_VERSION as PLAN_FORMAT_VERSION
from trtfleet_engines.buildplan import SHORT_HASH_LENGTH as SHORT_HASH_LENGTH
from trtfleet_engines.buildplan import BuildPlan as BuildPlan
from trtfleet_engines.buildplan import CommandStep as CommandStep
from trtfleet_engines.buildplan import FetchStep as FetchStep
from trtfleet_engines.buildplan import StageStep as StageStep
from trtfleet_engines.buildplan import Step as Step
from trtfleet_engines.buildplan import StepKind as StepKind
from trtfleet_engines.constraints import check_release, check_speculative, engine_features
from trtfleet_engines.errors import UnsupportedError
from trtfleet_engines.gpus import lookup_gpu
from trtfleet_engines.lora.merge import KEEP_BASE_DTYPE
from trtfleet_engines.speculation import vocabularies

DEFAULT_WORKDIR = "/work"
DEFAULT_TRTLLM_DIR = "/app/tensorrt_llm"
"""Where the build image holds TensorRT-LLM's sources (its ``examples/``); override per plan."""
PVC_MOUNT_ROOT = "/mnt/trtfleet/pvc"
"""pvc://<claim>/<path> is read at ``<PVC_MOUNT_ROOT>/<claim>/<path>``: the build Job mounts claims there."""
SERVE_ARTIFACT_DIR = "/trtfleet/artifact"
"""Where serving pods mount the published artifact; the rendered repository points inside it."""
ENGINE_SUBDIR = "engine"
VARIANT_SUBDIR = "variant"
"""Where a QLoRA base variant's dequantized checkpoint is written in the workdir."""
TOKENIZER_SUBDIR = "tokenizer"
REPOSITORY_SUBDIR = "model_repository"
PYTHON = "python3"
TRTLLM_BUILD = "trtllm-build"

# --- identity ----------------------------------------------------------------------------------------


def engine_identity(
    spec: BaseModelSpec,
    merged_adapter: Mapping[str, Any] | None = None,
    base_quantization: BaseQuantizationSpec | None = None,
) -> dict[str, Any]:
    """The canonical facts an engine depends on (what :func:`engine_hash` hashes). ``baseQuantization`` is
    only present for a QLoRA base variant, so the hashes of every other engine stay what they were."""
    engine = spec.engine
    lora: dict[str, Any] = {"enabled": spec.lora.enabled and merged_adapter is None}
    if lora["enabled"]:
        lora["maxRank"] = spec.lora.max_rank
        lora["targetModules"] = sorted(str(m) for m in spec.lora.target_modules)
    speculative: dict[str, Any] = {}
    if spec.speculative is not None:
        speculative = {"speculative": spec.speculative.to_wire()}  # every setting: drafts change what is served
    return speculative | {
        "planFormat": PLAN_FORMAT_VERSION,
        "source": {"uri": spec.source.uri, "revision": spec.source.revision},
        "architecture": str(spec.architecture),
        "dtype": str(spec.dtype),
        "quantization": {
            "mode": str(spec.quantization.mode),
            "kvCacheDtype": str(spec.quantization.kv_cache_dtype),
        },
        "parallelism": {"tensor": spec.parallelism.tensor, "pipeline": spec.parallelism.pipeline},
        "engine": {
            "maxBatchSize": engine.max_batch_size,
            "maxInputLen": engine.max_input_len,
            "maxSeqLen": engine.max_seq_len,
            "maxNumTokens": engine.max_num_tokens,
            "image": engine.image,
            "gpuSm": lookup_gpu(engine.gpu.product).sm,
        },
        "lora": lora,
        "mergedAdapter": dict(merged_adapter) if merged_adapter is not None else None,
    } | ({"baseQuantization": base_quantization.to_wire()} if base_quantization is not None else {})


def _hash(identity: Mapping[str, Any]) -> str:
    canonical = json.dumps(identity, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def engine_hash(spec: BaseModelSpec) -> str:
    """sha256 (hex) of the engine ``spec`` builds; equal hashes mean interchangeable engines."""
    return _hash(engine_identity(spec))


def engine_hash_short(spec: BaseModelSpec) -> str:
    return engine_hash(spec)[:SHORT_HASH_LENGTH]


# --- steps -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Converter:
    script: str
    gemma_style: bool
    pipeline: bool
    int8_kv_cache: bool


_LLAMA = Converter("examples/models/core/llama/convert_checkpoint.py", False, True, True)
CONVERTERS: dict[Architecture, Converter] = {
    Architecture.LLAMA: _LLAMA,
    Architecture.MISTRAL: _LLAMA,
    Architecture.MIXTRAL: _LLAMA,
    Architecture.QWEN2: Converter("examples/models/core/qwen/convert_checkpoint.py", False, True, True),
    Architecture.GEMMA: Converter("examples/models/core/gemma/convert_checkpoint.py", True, False, True),
    Architecture.PHI3: Converter("examples/models/core/phi/convert_checkpoint.py", False, False, False),
}
QUANTIZE_SCRIPT = "examples/quantization/quantize.py"
_QFORMAT = {
    QuantizationMode.NONE: "full_prec",
    QuantizationMode.INT8_WEIGHT_ONLY: "int8_wo",
    QuantizationMode.INT4_WEIGHT_ONLY: "int4_wo",
    QuantizationMode.INT4_AWQ: "int4_awq",
    QuantizationMode.FP8: "fp8",
}
_WEIGHT_ONLY = {QuantizationMode.INT8_WEIGHT_ONLY: "int8", QuantizationMode.INT4_WEIGHT_ONLY: "int4"}


def fetch_step(name: str, uri: str, revision: str | None, workdir: str, subdir: str) -> FetchStep:
    parsed = urlparse(uri)
    if parsed.scheme in ("hf", "s3"):
        return FetchStep(name, parsed.scheme, uri, revision, f"{workdir}/{subdir}", True)
    if parsed.scheme == "pvc":
        return FetchStep(name, "pvc", uri, revision, f"{PVC_MOUNT_ROOT}/{parsed.netloc}{parsed.path}", False)
    if parsed.scheme == "file":
        return FetchStep(name, "file", uri, revision, parsed.path, False)
    raise UnsupportedError(f"source {uri!r}: unsupported scheme {parsed.scheme!r} (hf, s3, pvc or file)")


def _check_supported(spec: BaseModelSpec) -> None:
    gpu = lookup_gpu(spec.engine.gpu.product)
    quant = spec.quantization
    base_vocab, draft_vocab = vocabularies(spec)
    check_speculative(spec, base_vocab=base_vocab, draft_vocab=draft_vocab)
    if spec.runtime == Runtime.REFERENCE:
        if quant.mode != QuantizationMode.NONE or quant.kv_cache_dtype != KvCacheDtype.AUTO:
            raise UnsupportedError("runtime reference runs the model in its dtype: set quantization.mode "
                                   "none and quantization.kvCacheDtype auto")
        return
    if gpu.is_cpu:
        raise UnsupportedError("engine.gpu.product cpu is only for runtime reference: pick a GPU product")
    check_release(spec, gpu)
    if spec.parallelism.pipeline > 1 and not CONVERTERS[spec.architecture].pipeline:
        raise UnsupportedError(f"TRT-LLM's {spec.architecture} converter has no pipeline parallelism: set "
                               "parallelism.pipeline 1 (use parallelism.tensor instead)")


MEDUSA_CONVERTER = "examples/medusa/convert_checkpoint.py"


def medusa_checkpoint_step(
    spec: BaseModelSpec, model_dir: str, draft_dir: str, checkpoint_dir: str, trtllm_dir: str
) -> CommandStep:
    """``convert-checkpoint`` of a base model with Medusa heads (examples/medusa/convert_checkpoint.py@063e02f7)."""
    speculative = spec.speculative
    if speculative is None or speculative.draft is None or speculative.draft.num_heads is None:
        raise UnsupportedError("mode Medusa needs speculative.draft with numHeads")
    tp, pp = spec.parallelism.tensor, spec.parallelism.pipeline
    return CommandStep("convert-checkpoint", (
        PYTHON, f"{trtllm_dir}/{MEDUSA_CONVERTER}", "--model_dir", model_dir, "--medusa_model_dir", draft_dir,
        "--output_dir", checkpoint_dir, "--dtype", str(spec.dtype), "--num_medusa_heads",
        str(speculative.draft.num_heads), "--tp_size", str(tp), "--pp_size", str(pp), "--workers", str(tp * pp),
    ))


def checkpoint_step(spec: BaseModelSpec, model_dir: str, checkpoint_dir: str, trtllm_dir: str) -> CommandStep:
    """``convert-checkpoint`` or ``quantize``, whichever the quantization settings need."""
    quant, tp, pp = spec.quantization, spec.parallelism.tensor, spec.parallelism.pipeline
    converter = CONVERTERS[spec.architecture]
    kv = quant.kv_cache_dtype
    needs_quantize = (
        quant.mode in (QuantizationMode.FP8, QuantizationMode.INT4_AWQ)
        or kv == KvCacheDtype.FP8
        or (kv == KvCacheDtype.INT8 and not converter.int8_kv_cache)
    )
    if needs_quantize:
        argv = [PYTHON, f"{trtllm_dir}/{QUANTIZE_SCRIPT}", "--model_dir", model_dir, "--output_dir",
                checkpoint_dir, "--dtype", str(spec.dtype), "--qformat", _QFORMAT[quant.mode]]
        if kv != KvCacheDtype.AUTO:
            argv += ["--kv_cache_dtype", str(kv)]
        argv += ["--tp_size", str(tp), "--pp_size", str(pp)]
        return CommandStep("quantize", tuple(argv))
    script = f"{trtllm_dir}/{converter.script}"
    if converter.gemma_style:
        argv = [PYTHON, script, "--ckpt-type", "hf", "--model-dir", model_dir, "--output-model-dir",
                checkpoint_dir, "--dtype", str(spec.dtype), "--world-size", str(tp)]
    else:
        argv = [PYTHON, script, "--model_dir", model_dir, "--output_dir", checkpoint_dir, "--dtype",
                str(spec.dtype), "--tp_size", str(tp), "--pp_size", str(pp)]
    if quant.mode in _WEIGHT_ONLY:
        argv += ["--use_weight_only", "--weight_only_precision", _WEIGHT_ONLY[quant.mode]]
    if kv == KvCacheDtype.INT8:
        argv.append("--int8_kv_cache")
    if not converter.gemma_style:
        argv += ["--workers", str(tp * pp)]
    return CommandStep("convert-checkpoint", tuple(argv))


def build_step(spec: BaseModelSpec, checkpoint_dir: str, engine_dir: str, *, lora: bool) -> CommandStep:
    """``trtllm-build`` for in-flight batching (attention plugin, no padding, paged KV and context FMHA).

    ``--use_paged_context_fmha`` is what the builder will really do (:mod:`trtfleet_engines.constraints`:
    it turns it off with an int8 KV cache, or an fp8 KV cache without fp8 weights).
    """
    engine = spec.engine
    gemm = "disable" if spec.quantization.mode == QuantizationMode.FP8 else "auto"
    paged_context_fmha = "enable" if engine_features(spec).paged_context_fmha else "disable"
    argv = [TRTLLM_BUILD, "--checkpoint_dir", checkpoint_dir, "--output_dir", engine_dir,
            "--max_batch_size", str(engine.max_batch_size), "--max_input_len", str(engine.max_input_len),
            "--max_seq_len", str(engine.max_seq_len), "--max_num_tokens", str(engine.max_num_tokens),
            "--max_beam_width", "1", "--gpt_attention_plugin", "auto", "--gemm_plugin", gemm,
            "--remove_input_padding", "enable", "--kv_cache_type", "paged",
            "--use_paged_context_fmha", paged_context_fmha]
    if lora:
        modules = sorted(spec.lora.target_modules, key=lambda m: LoraModule(m).module_id)
        argv += ["--lora_plugin", str(spec.dtype), "--lora_target_modules", *[str(m) for m in modules],
                 "--max_lora_rank", str(spec.lora.max_rank)]
    if spec.speculative is not None and spec.speculative.mode is SpeculativeMode.MEDUSA:
        argv += ["--speculative_decoding_mode", "medusa", "--max_draft_len", str(spec.speculative.max_draft_len)]
    argv += ["--workers", str(spec.parallelism.tensor * spec.parallelism.pipeline)]
    return CommandStep(TRTLLM_BUILD, tuple(argv))


def plan_engine_build(
    spec: BaseModelSpec,
    *,
    workdir: str = DEFAULT_WORKDIR,
    trtllm_dir: str = DEFAULT_TRTLLM_DIR,
    serve_dir: str = SERVE_ARTIFACT_DIR,
) -> BuildPlan:
    """The plan that builds (and stages a Triton repository for) the engine ``spec`` describes."""
    return _plan(spec, workdir=workdir, trtllm_dir=trtllm_dir, serve_dir=serve_dir, merged_adapter=None)


def merged_spec(spec: BaseModelSpec) -> BaseModelSpec:
    """``spec`` as served by a merged-adapter engine: the same, with the LoRA plugin off."""
    lora = LoraSpec.model_validate({**spec.lora.model_dump(by_alias=True), "enabled": False})
    return spec.model_copy(update={"lora": lora})


def plan_merged_engine_build(
    spec: BaseModelSpec,
    adapter_source_uri: str,
    adapter_revision: str | None,
    *,
    workdir: str = DEFAULT_WORKDIR,
    trtllm_dir: str = DEFAULT_TRTLLM_DIR,
    serve_dir: str = SERVE_ARTIFACT_DIR,
) -> BuildPlan:
    """A derived build: merge the adapter into the base weights (``trtfleet lora merge``), then build
    without the LoRA plugin. Its hash covers the adapter's source and revision."""
    adapter = {"uri": adapter_source_uri, "revision": adapter_revision}
    return _plan(spec, workdir=workdir, trtllm_dir=trtllm_dir, serve_dir=serve_dir, merged_adapter=adapter)


def plan_variant_engine_build(
    spec: BaseModelSpec,
    base_quantization: BaseQuantizationSpec,
    *,
    workdir: str = DEFAULT_WORKDIR,
    trtllm_dir: str = DEFAULT_TRTLLM_DIR,
    serve_dir: str = SERVE_ARTIFACT_DIR,
) -> BuildPlan:
    """A QLoRA base variant: the base's linear weights quantized and dequantized as bitsandbytes does
    (``trtfleet lora base-variant``), then converted and built like the base, LoRA plugin included. Its hash
    covers the base engine's identity plus the quantization."""
    return _plan(spec, workdir=workdir, trtllm_dir=trtllm_dir, serve_dir=serve_dir, merged_adapter=None,
                 base_quantization=base_quantization)


def check_variant_supported(spec: BaseModelSpec) -> None:
    """A base variant is served as dequantized: a weight quantization on top would change it again."""
    if spec.quantization.mode != QuantizationMode.NONE:
        raise UnsupportedError(
            f"a QLoRA base variant is served in the base's dtype, but the BaseModel quantizes its weights "
            f"(quantization.mode {spec.quantization.mode}), which would change the dequantized weights the "
            "adapter learned against: serve QLoRA adapters on a BaseModel with quantization.mode none"
        )


def _plan(
    spec: BaseModelSpec,
    *,
    workdir: str,
    trtllm_dir: str,
    serve_dir: str,
    merged_adapter: Mapping[str, Any] | None,
    base_quantization: BaseQuantizationSpec | None = None,
) -> BuildPlan:
    _check_supported(spec)
    if base_quantization is not None:
        check_variant_supported(spec)
    workdir = workdir.rstrip("/") or "/"
    serve_engine = f"{serve_dir}/{ENGINE_SUBDIR}"
    engine_dir = f"{workdir}/{ENGINE_SUBDIR}"
    fetch = fetch_step("fetch", spec.source.uri, spec.source.revision, workdir, "source")
    steps: list[Step] = [fetch]
    render_spec = spec
    model_dir = fetch.local_dir
    if merged_adapter is not None:
        # The reference engine computes in float32: it keeps the base dtype (trtfleet_engines.reference.merged).
        dtype = KEEP_BASE_DTYPE if spec.runtime == Runtime.REFERENCE else str(spec.dtype)
        adapter = fetch_step("fetch-adapter", str(merged_adapter["uri"]), merged_adapter.get("revision"),
                             workdir, "adapter")
        merged_dir = f"{workdir}/merged"
        steps += [adapter, CommandStep("merge-lora", ("trtfleet", "lora", "merge", "--base", model_dir,
                                                      "--adapter", adapter.local_dir, "--dtype", dtype,
                                                      "--out", merged_dir))]
        model_dir = merged_dir
        render_spec = merged_spec(spec)
    if base_quantization is not None:
        variant_dir = f"{workdir}/{VARIANT_SUBDIR}"
        steps.append(CommandStep("dequantize-base", ("trtfleet", "lora", "base-variant", "--base", model_dir,
                                                     "--quantization", base_quantization.variant_text(),
                                                     "--out", variant_dir)))
        model_dir = variant_dir
    if spec.runtime == Runtime.REFERENCE:
        steps.append(StageStep("stage", model_dir, engine_dir, True, serve_engine, serve_engine))
    else:
        checkpoint_dir = f"{workdir}/checkpoint"
        speculative = spec.speculative
        if speculative is not None and speculative.mode is SpeculativeMode.MEDUSA and speculative.draft is not None:
            draft = fetch_step("fetch-draft", speculative.draft.source.uri, speculative.draft.source.revision,
                               workdir, "draft")
            steps.append(draft)
            steps.append(medusa_checkpoint_step(spec, model_dir, draft.local_dir, checkpoint_dir, trtllm_dir))
        else:
            steps.append(checkpoint_step(spec, model_dir, checkpoint_dir, trtllm_dir))
        lora = spec.lora.enabled and merged_adapter is None
        steps.append(build_step(spec, checkpoint_dir, engine_dir, lora=lora))
        steps.append(StageStep("stage", fetch.local_dir, engine_dir, False, serve_engine,
                               f"{serve_dir}/{TOKENIZER_SUBDIR}"))
    return BuildPlan(
        engine_hash=_hash(engine_identity(spec, merged_adapter, base_quantization)),
        image=spec.engine.image,
        gpu_sm=lookup_gpu(spec.engine.gpu.product).sm,
        workdir=workdir,
        steps=tuple(steps),
        spec=render_spec.to_wire(),
        merged_adapter=merged_adapter,
    )
