"""How a ``trtllm-serve`` pod starts and is probed, and how its checkpoint is prepared: pure data.

* :func:`serve_argv`: ``trtllm-serve <staged checkpoint dir> --backend pytorch --host 0.0.0.0 --port 8000
  --config <options file> --served_model_name <name>``. Everything else (parallelism, limits, KV cache,
  LoRA) is in the options file (:mod:`trtfleet_engines.pytorch.options`); no flag repeats a key of the
  file, because explicit flags take precedence over it upstream. ``--host`` must be given: its default is
  ``localhost``, which a Service cannot reach.
* :func:`probes`: startup, readiness and liveness on ``GET /health`` (200 once the executor is up, 503
  when it is not).
* :func:`plan_prepare`: what a prepare Job does instead of an engine build: stage the HF checkpoint once
  per :func:`prepare_hash` into the model cache, and with ``quantization.mode`` other than ``none`` run
  NVIDIA ModelOpt's ``hf_ptq.py`` to export a quantized HF checkpoint there.

:func:`prepare_hash` covers only what changes the staged checkpoint: the source (URI, revision), and when
quantizing the ModelOpt format, the KV-cache format and the image that runs ModelOpt; for a merged Adapter
(``mode: merged``, :class:`MergeStep`: the PEFT adapter folded into the staged weights with ``trtfleet lora
merge`` at the spec's dtype, before any quantization) also the adapter's URI and revision and that dtype.
For a QLoRA base variant (:class:`BaseVariantStep`: every decoder linear weight quantized and dequantized as
bitsandbytes does, ``trtfleet lora base-variant``) the quantization is part of the hash too. With
``speculative.draft`` the draft checkpoint is staged beside the model (:class:`DraftStep`, ``<root>/draft``, what
``speculative_config.speculative_model`` names) and its URI and revision join the hash; the Job checks that it
fits the model (:func:`trtfleet_engines.speculation.draft_problems`) before anything is served.
Parallelism, limits, LoRA and serving settings change the options file, never the checkpoint, so they never re-stage it.
Errors: :class:`~trtfleet_engines.errors.UnsupportedError` for a quantization ModelOpt cannot export as an
HF checkpoint for this backend.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
from dataclasses import asdict, dataclass

from trtfleet.api.basemodel import BaseModelSpec, KvCacheDtype, QuantizationMode
from trtfleet_engines.errors import UnsupportedError

SERVE_COMMAND = "trtllm-serve"
SERVE_HOST = "0.0.0.0"
SERVE_PORT = 8000
HEALTH_PATH = "/health"
PREPARE_FORMAT = "trtfleet-pytorch-prepare-v1"
"""Bumped when the staged layout changes, so every checkpoint is staged again."""
MODELOPT_HF_PTQ = "/opt/modelopt/examples/llm_ptq/hf_ptq.py"
"""Where the prepare image keeps ModelOpt's ``examples/llm_ptq/hf_ptq.py`` (an image convention of trtfleet)."""
CHECKPOINTS_DIR = "checkpoints"
ORIGINAL_DIR = "original"
QUANTIZED_DIR = "quantized"
ADAPTER_DIR = "adapter"
MERGED_DIR = "merged"
VARIANT_DIR = "variant"
DRAFT_DIR = "draft"
STARTUP_TIMEOUT_S = 1800
"""Loading weights and capturing CUDA graphs of a large model takes many minutes."""

_MODELOPT_QFORMATS = {
    QuantizationMode.FP8: "fp8",
    QuantizationMode.INT4_AWQ: "int4_awq",
    QuantizationMode.INT8_WEIGHT_ONLY: "int8_wo",
}
_MODELOPT_KV_QFORMATS = {KvCacheDtype.AUTO: "none", KvCacheDtype.FP8: "fp8"}


def serve_argv(
    *, checkpoint_dir: str, options_path: str, served_model_name: str | None, port: int = SERVE_PORT
) -> tuple[str, ...]:
    """The serving container's command line.

    ``served_model_name`` None leaves the flag out (versions without it name the model after the directory);
    versions older than the ``--config`` spelling take the same file as ``--extra_llm_api_options``.
    """
    argv = (
        SERVE_COMMAND, checkpoint_dir,
        "--backend", "pytorch",
        "--host", SERVE_HOST,
        "--port", str(port),
        "--config", options_path,
    )
    return argv if served_model_name is None else (*argv, "--served_model_name", served_model_name)


@dataclass(frozen=True)
class HttpProbe:
    """One Kubernetes HTTP probe (``httpGet`` path and port, timings in seconds)."""

    path: str
    port: int
    period_s: int
    timeout_s: int
    failure_threshold: int

    def to_kubernetes(self) -> dict[str, object]:
        return {
            "httpGet": {"path": self.path, "port": self.port},
            "periodSeconds": self.period_s,
            "timeoutSeconds": self.timeout_s,
            "failureThreshold": self.failure_threshold,
        }


@dataclass(frozen=True)
class ServingProbes:
    startup: HttpProbe
    readiness: HttpProbe
    liveness: HttpProbe


def probes(port: int = SERVE_PORT) -> ServingProbes:
    """Probes on ``GET /health``: a long startup window, then quick readiness and patient liveness."""
    startup_period_s = 10
    return ServingProbes(
        startup=HttpProbe(HEALTH_PATH, port, startup_period_s, 5, STARTUP_TIMEOUT_S // startup_period_s),
        readiness=HttpProbe(HEALTH_PATH, port, 5, 3, 2),
        liveness=HttpProbe(HEALTH_PATH, port, 10, 5, 6),
    )


def _quantization(spec: BaseModelSpec) -> tuple[str, str] | None:
    """(ModelOpt ``--qformat``, ``--kv_cache_qformat``) or None when the checkpoint is served as staged."""
    mode = spec.quantization.mode
    if mode is QuantizationMode.NONE:
        return None
    if mode not in _MODELOPT_QFORMATS:
        raise UnsupportedError(
            f"quantization.mode {mode.value} has no ModelOpt HF export for the PyTorch backend: use int4_awq, "
            "int8_weight_only or fp8"
        )
    kv = spec.quantization.kv_cache_dtype
    if kv not in _MODELOPT_KV_QFORMATS:
        raise UnsupportedError(f"quantization.kvCacheDtype {kv.value} is not available on the PyTorch backend")
    return _MODELOPT_QFORMATS[mode], _MODELOPT_KV_QFORMATS[kv]


@dataclass(frozen=True)
class MergedAdapterSource:
    """The PEFT adapter of an Adapter with ``mode: merged``."""

    uri: str
    revision: str | None


def prepare_hash(
    spec: BaseModelSpec, merged: MergedAdapterSource | None = None, base_quantization: str | None = None
) -> str:
    """Content address of the staged checkpoint (hex sha256, 16 characters); ``base_quantization``: a QLoRA
    base variant's ``TYPE:BLOCK[:double]:DTYPE``."""
    identity: dict[str, object] = {
        "format": PREPARE_FORMAT,
        "source": spec.source.uri.rstrip("/"),
        "revision": spec.source.revision,
    }
    if merged is not None:
        identity["mergedAdapter"] = {"uri": merged.uri.rstrip("/"), "revision": merged.revision}
        identity["mergedDtype"] = spec.dtype.value
    if base_quantization is not None:
        identity["baseQuantization"] = base_quantization
    draft = spec.speculative.draft if spec.speculative is not None else None
    if draft is not None:
        identity["draft"] = {"uri": draft.source.uri.rstrip("/"), "revision": draft.source.revision}
    quantization = _quantization(spec)
    if quantization is not None:
        identity["qformat"], identity["kvCacheQformat"] = quantization
        identity["image"] = spec.engine.image
    canonical = json.dumps(identity, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:16]


@dataclass(frozen=True)
class StageStep:
    """Copy the source checkpoint (HF layout) into ``destination_dir``, once."""

    source_uri: str
    revision: str | None
    destination_dir: str


@dataclass(frozen=True)
class QuantizeStep:
    """Run ModelOpt on the staged checkpoint; ``argv`` writes a quantized HF checkpoint to ``output_dir``."""

    argv: tuple[str, ...]
    output_dir: str


@dataclass(frozen=True)
class MergeStep:
    """Fetch the PEFT adapter to ``adapter_dir`` and fold it into the staged checkpoint, written to ``output_dir``."""

    adapter_uri: str
    revision: str | None
    adapter_dir: str
    dtype: str
    output_dir: str


@dataclass(frozen=True)
class BaseVariantStep:
    """Write the staged checkpoint with its linear weights quantized and dequantized as bitsandbytes does
    (``quantization``: ``TYPE:BLOCK[:double]:DTYPE``) to ``output_dir``: the base a QLoRA adapter learned on."""

    quantization: str
    output_dir: str


@dataclass(frozen=True)
class DraftStep:
    """Stage the speculative draft (HF layout) into ``destination_dir`` once, and check it fits the model
    (``mode``: the speculative mode whose rules apply)."""

    source_uri: str
    revision: str | None
    destination_dir: str
    mode: str


@dataclass(frozen=True)
class PreparePlan:
    """What the prepare Job does for one content hash, and which directory ``trtllm-serve`` then loads."""

    content_hash: str
    root_dir: str
    stage: StageStep
    quantize: QuantizeStep | None
    merge: MergeStep | None = None
    variant: BaseVariantStep | None = None
    draft: DraftStep | None = None

    @property
    def serve_checkpoint_dir(self) -> str:
        if self.quantize is not None:
            return self.quantize.output_dir
        if self.variant is not None:
            return self.variant.output_dir
        return self.merge.output_dir if self.merge is not None else self.stage.destination_dir

    def to_dict(self) -> dict[str, object]:
        """The plan as the prepare Job reads it; without ``merge`` when there is none, so the plans of plain
        checkpoints stay byte for byte what they were."""
        data = asdict(self)
        for optional in ("merge", "variant", "draft"):
            if data[optional] is None:
                del data[optional]
        return data


def staged_root(cache_root: str, content_hash: str) -> str:
    """``<cache root>/checkpoints/<hash>``: one directory per content hash, shared by every pod."""
    return posixpath.join(cache_root.rstrip("/"), CHECKPOINTS_DIR, content_hash)


def plan_prepare(
    spec: BaseModelSpec,
    *,
    cache_root: str,
    trust_remote_code: bool = False,
    merged: MergedAdapterSource | None = None,
    base_quantization: str | None = None,
) -> PreparePlan:
    """The prepare plan of ``spec`` under the model cache mounted at ``cache_root`` (with ``merged``: the
    checkpoint of that adapter folded into the model; with ``base_quantization``: QLoRA's base variant of it,
    which no ModelOpt quantization may change again)."""
    if base_quantization is not None and spec.quantization.mode is not QuantizationMode.NONE:
        raise UnsupportedError(
            f"a QLoRA base variant is served as dequantized, but quantization.mode {spec.quantization.mode.value} "
            "would quantize it again: serve QLoRA adapters on a BaseModel with quantization.mode none"
        )
    content_hash = prepare_hash(spec, merged, base_quantization)
    root = staged_root(cache_root, content_hash)
    stage = StageStep(spec.source.uri, spec.source.revision, posixpath.join(root, ORIGINAL_DIR))
    merge: MergeStep | None = None
    if merged is not None:
        merge = MergeStep(merged.uri, merged.revision, posixpath.join(root, ADAPTER_DIR), spec.dtype.value,
                          posixpath.join(root, MERGED_DIR))
    weights_dir = merge.output_dir if merge is not None else stage.destination_dir
    variant: BaseVariantStep | None = None
    if base_quantization is not None:
        variant = BaseVariantStep(base_quantization, posixpath.join(root, VARIANT_DIR))
        weights_dir = variant.output_dir
    quantization = _quantization(spec)
    quantize: QuantizeStep | None = None
    if quantization is not None:
        qformat, kv_qformat = quantization
        output = posixpath.join(root, QUANTIZED_DIR)
        argv = (
            "python3", MODELOPT_HF_PTQ,
            "--pyt_ckpt_path", weights_dir,
            "--qformat", qformat,
            "--kv_cache_qformat", kv_qformat,
            "--export_path", output,
        )
        quantize = QuantizeStep(argv + (("--trust_remote_code",) if trust_remote_code else ()), output)
    draft: DraftStep | None = None
    if spec.speculative is not None and spec.speculative.draft is not None:
        source = spec.speculative.draft.source
        draft = DraftStep(source.uri, source.revision, posixpath.join(root, DRAFT_DIR), spec.speculative.mode.value)
    return PreparePlan(content_hash, root, stage, quantize, merge, variant, draft)
