"""What the pinned TensorRT-LLM release builds and loads, as data: one table, three users.

trtfleet builds engines with the legacy TensorRT workflow of TensorRT-LLM 1.2.1 (the last release with
the ``tensorrtllm`` C++ Triton backend; tensorrtllm_backend ``8addf2f`` pins ``release/1.2.1``). Nothing
here can run that release, so what it refuses is written down once, from its sources, and used by:

* plan validation (:func:`check_release`, called by :func:`trtfleet_engines.plan.plan_engine_build`): a
  spec the release refuses raises :class:`~trtfleet_engines.errors.ReleaseConstraintError` naming the
  rule and the fix, before a build Job starts (the operator turns it into the ``EngineBuilt`` condition);
* the rendered ``tensorrt_llm`` config (:func:`engine_features`): ``enable_chunked_context`` and
  ``enable_kv_cache_reuse`` follow the engine's paged context FMHA when the spec leaves them unset;
* the build plan: ``--use_paged_context_fmha`` says what the builder will really do.

Three kinds of rules:

* :data:`BUILD_RULES` - (quantization x KV-cache dtype x GPU SM) combinations. ``refuse`` rules are the
  builder's ``RuntimeError``\\ s (and fp8 without fp8 hardware); ``no-paged-context-fmha`` rules are the
  builder silently turning ``use_paged_context_fmha`` off.
* :data:`RUNTIME_RULES` - serving options that need paged context FMHA in the engine.
* :data:`SPECULATIVE_RULES` - speculative-decoding settings by runtime and by the TensorRT-LLM release the
  image's tag names (:func:`image_release`), for every runtime (:func:`check_speculative`; the version-free
  rules are CEL rules of the CRD, ``trtfleet.api.speculative``). docs/speculative-decoding.md has the evidence.

Upstream file versions are ``path@commit`` in NVIDIA/TensorRT-LLM unless named otherwise; the whole
table with its evidence is docs/engine-fidelity.md. Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from trtfleet.api.basemodel import (
    Architecture,
    BaseModelSpec,
    KvCacheDtype,
    QuantizationMode,
    Runtime,
    SpeculativeMode,
)
from trtfleet_engines.errors import ReleaseConstraintError
from trtfleet_engines.gpus import GpuSpec, lookup_gpu

RELEASE = "TensorRT-LLM 1.2.1"
BUILDER = "tensorrt_llm/builder.py@14e801da (build)"
INFLIGHT_BATCHING = "cpp/tensorrt_llm/batch_manager/trtGptModelInflightBatching.cpp@00825c4e"

BuildEffect = Literal["refuse", "no-paged-context-fmha"]
_ANY_QUANTIZATION: frozenset[QuantizationMode] = frozenset(QuantizationMode)
_ANY_KV: frozenset[KvCacheDtype] = frozenset(KvCacheDtype)
_INT_WEIGHTS = frozenset(
    {QuantizationMode.INT8_WEIGHT_ONLY, QuantizationMode.INT4_WEIGHT_ONLY, QuantizationMode.INT4_AWQ}
)


@dataclass(frozen=True)
class BuildRule:
    """A (quantization x KV dtype x SM) combination and what the release does with it.

    It applies when the spec's quantization mode is in ``quantization``, its KV-cache dtype in
    ``kv_cache`` and the GPU's SM number in ``[sm_from, sm_below)`` (CPU pseudo-GPUs have no SM and
    match no SM-bounded rule).
    """

    rule_id: str
    quantization: frozenset[QuantizationMode]
    kv_cache: frozenset[KvCacheDtype]
    effect: BuildEffect
    upstream: str
    fix: str
    sm_from: int = 0
    sm_below: int | None = None

    def applies(self, mode: QuantizationMode, kv: KvCacheDtype, sm: int | None) -> bool:
        if mode not in self.quantization or kv not in self.kv_cache:
            return False
        if self.sm_from == 0 and self.sm_below is None:
            return True
        if sm is None:
            return False
        return sm >= self.sm_from and (self.sm_below is None or sm < self.sm_below)


BUILD_RULES: tuple[BuildRule, ...] = (
    BuildRule(
        "fp8-needs-sm89",
        frozenset({QuantizationMode.FP8}), _ANY_KV, "refuse",
        "hardware: FP8 tensor cores start at Ada sm_89 (builder.py disables FP8 context FMHA below 89)",
        "quantization.mode fp8 needs a GPU with fp8: use quantization.mode int8_weight_only or int4_awq, or an "
        "fp8 GPU (L4, L40S, H100-80GB, H200, B200)",
        sm_below=89,
    ),
    BuildRule(
        "fp8-kv-needs-sm89",
        _ANY_QUANTIZATION, frozenset({KvCacheDtype.FP8}), "refuse",
        "hardware: FP8 tensor cores start at Ada sm_89 (builder.py disables FP8 context FMHA below 89)",
        "quantization.kvCacheDtype fp8 needs a GPU with fp8: use quantization.kvCacheDtype int8 or auto, or an "
        "fp8 GPU (L4, L40S, H100-80GB, H200, B200)",
        sm_below=89,
    ),
    BuildRule(
        "sm100-no-int-weights",
        _INT_WEIGHTS, _ANY_KV, "refuse",
        f"{BUILDER}: 'INT8/INT4 quantization is not supported on SM>=100.' (is_int8_weight_only, "
        "is_int4_weight_only, which int4_awq's W4A16_AWQ is)",
        "on B200 use quantization.mode none or fp8, or build for a Hopper/Ada/Ampere GPU",
        sm_from=100, sm_below=120,
    ),
    BuildRule(
        "sm100-no-int8-kv",
        _ANY_QUANTIZATION, frozenset({KvCacheDtype.INT8}), "refuse",
        f"{BUILDER}: 'INT8/INT4 quantization is not supported on SM>=100.' (has_int8_kv_cache)",
        "on B200 use quantization.kvCacheDtype fp8 or auto",
        sm_from=100, sm_below=120,
    ),
    BuildRule(
        "int8-kv-no-paged-context-fmha",
        _ANY_QUANTIZATION, frozenset({KvCacheDtype.INT8}), "no-paged-context-fmha",
        f"{BUILDER}: 'Paged Context FMHA is disabled because it doesn't work with int8 kv cache currently.'",
        "use quantization.kvCacheDtype fp8 (with quantization.mode fp8) or auto to keep chunked context and "
        "KV-cache reuse",
    ),
    BuildRule(
        "fp8-kv-without-fp8-weights-no-paged-context-fmha",
        _ANY_QUANTIZATION - {QuantizationMode.FP8}, frozenset({KvCacheDtype.FP8}), "no-paged-context-fmha",
        f"{BUILDER}: quant_algo not in (FP8, W4A8_AWQ, NVFP4) -> 'FP8 Paged Context FMHA is disabled because "
        "FP8 context FMHA is disabled.'",
        "use quantization.mode fp8 with an fp8 KV cache, or kvCacheDtype auto, to keep chunked context and "
        "KV-cache reuse",
    ),
)


@dataclass(frozen=True)
class RuntimeRule:
    """A serving option the runtime accepts only when the engine has paged context FMHA."""

    rule_id: str
    field: str
    parameter: str
    consequence: str
    upstream: str


RUNTIME_RULES: tuple[RuntimeRule, ...] = (
    RuntimeRule(
        "chunked-context-needs-paged-context-fmha",
        "serving.enableChunkedContext",
        "enable_chunked_context",
        "the runtime refuses to start",
        f"{INFLIGHT_BATCHING}: TLLM_CHECK 'Chunked context requires context FMHA, paged kv_cache and paged "
        "context FMHA all enabled at the same time.'",
    ),
    RuntimeRule(
        "kv-reuse-needs-paged-context-fmha",
        "serving.enableKvCacheReuse",
        "enable_kv_cache_reuse",
        "block reuse needs it, and releases before 1.0 refuse to start",
        "docs/source/kv_cache_reuse.md ('KV cache reuse requires the model to be built for paged context "
        "attention'); releases before 1.0 abort executor construction: 'When KV cache block reuse is set, "
        "model has to be built with paged context FMHA support' (trtGptModelInflightBatching.cpp, "
        "TrtGptModelOptionalParams era)",
    ),
)


@dataclass(frozen=True)
class EngineFeatures:
    """What the engine and the runtime will really do; ``reasons`` say why a feature is off."""

    paged_context_fmha: bool
    chunked_context: bool
    kv_cache_reuse: bool
    reasons: tuple[str, ...] = ()


def sm_number(gpu: GpuSpec) -> int | None:
    """``sm_90`` -> 90; None for the CPU pseudo product."""
    if gpu.is_cpu:
        return None
    return int(gpu.sm.removeprefix("sm_"))


def _build_rules(spec: BaseModelSpec, sm: int | None) -> list[BuildRule]:
    if spec.runtime is Runtime.REFERENCE:
        return []
    quant = spec.quantization
    return [rule for rule in BUILD_RULES if rule.applies(quant.mode, quant.kv_cache_dtype, sm)]


def _requested(spec: BaseModelSpec, rule: RuntimeRule) -> bool | None:
    serving = spec.serving
    if rule.parameter == "enable_chunked_context":
        return serving.enable_chunked_context
    return serving.enable_kv_cache_reuse


def engine_features(spec: BaseModelSpec) -> EngineFeatures:
    """Paged context FMHA of ``spec``'s engine, and the chunked-context / KV-reuse values to render.

    An option left unset follows the engine; an explicit value is kept (:func:`check_release` refuses
    an explicit ``true`` the engine cannot honour).
    """
    # Paged context FMHA does not depend on the GPU: an unknown product (refused by planning) renders too.
    off = [rule for rule in _build_rules(spec, None) if rule.effect == "no-paged-context-fmha"]
    paged = not off
    reasons = [f"{rule.rule_id}: {rule.upstream}" for rule in off]
    values: dict[str, bool] = {}
    for runtime_rule in RUNTIME_RULES:
        requested = _requested(spec, runtime_rule)
        values[runtime_rule.parameter] = paged if requested is None else requested
        if requested is None and not paged:
            reasons.append(f"{runtime_rule.parameter} false ({runtime_rule.rule_id}): {runtime_rule.upstream}")
    return EngineFeatures(
        paged_context_fmha=paged,
        chunked_context=values["enable_chunked_context"],
        kv_cache_reuse=values["enable_kv_cache_reuse"],
        reasons=tuple(reasons),
    )


def release_violations(spec: BaseModelSpec, gpu: GpuSpec | None = None) -> tuple[str, ...]:
    """One message per rule of the release that ``spec`` breaks (empty: the release accepts it)."""
    gpu = gpu or lookup_gpu(spec.engine.gpu.product)
    quant = spec.quantization
    rules = _build_rules(spec, sm_number(gpu))
    messages = [
        f"[{rule.rule_id}] quantization.mode {quant.mode} with kvCacheDtype {quant.kv_cache_dtype} on "
        f"{gpu.product} ({gpu.sm}) is refused by {RELEASE} ({rule.upstream}): {rule.fix}"
        for rule in rules
        if rule.effect == "refuse"
    ]
    off = [rule for rule in rules if rule.effect == "no-paged-context-fmha"]
    if off:
        for runtime_rule in RUNTIME_RULES:
            if _requested(spec, runtime_rule) is True:
                messages.append(
                    f"[{runtime_rule.rule_id}] {runtime_rule.field} true needs paged context FMHA, which "
                    f"{RELEASE} builds without for this spec ({off[0].rule_id}: {off[0].upstream}); "
                    f"{runtime_rule.consequence} ({runtime_rule.upstream}): remove {runtime_rule.field} "
                    f"(it then follows the engine) or set it false, or {off[0].fix}"
                )
    return tuple(messages)


def check_release(spec: BaseModelSpec, gpu: GpuSpec | None = None) -> None:
    """Raise :class:`ReleaseConstraintError` when the pinned release would refuse ``spec``."""
    messages = release_violations(spec, gpu)
    if messages:
        rule_id = messages[0][1 : messages[0].index("]")]
        raise ReleaseConstraintError(rule_id, "; ".join(messages))


# --- speculative decoding: what each TensorRT-LLM release takes ---------------------------------------


@dataclass(frozen=True)
class TrtllmRelease:
    """A TensorRT-LLM version: ``1.3.0rc20`` is (1, 3, 0, 20); a final release has ``rc`` None and sorts after
    its release candidates."""

    major: int
    minor: int
    patch: int
    rc: int | None = None

    @property
    def key(self) -> tuple[int, int, int, float]:
        return (self.major, self.minor, self.patch, float("inf") if self.rc is None else float(self.rc))

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}.{self.patch}" + ("" if self.rc is None else f"rc{self.rc}")

    @classmethod
    def parse(cls, text: str) -> TrtllmRelease | None:
        match = _RELEASE_RE.fullmatch(text.strip())
        if match is None:
            return None
        rc = match["rc"]
        return cls(int(match["major"]), int(match["minor"]), int(match["patch"]), None if rc is None else int(rc))


_RELEASE_RE = re.compile(r"v?(?P<major>\d+)\.(?P<minor>\d+)\.(?P<patch>\d+)(?:\.?rc(?P<rc>\d+))?(?:\.post\d+)?")
_TRITON_TAG_RE = re.compile(r"(?P<yymm>\d\d\.\d\d)-trtllm-python-py3")
TRITON_CONTAINER_RELEASES: dict[str, TrtllmRelease] = {"25.12": TrtllmRelease(1, 2, 1)}
"""Triton ``<yy.mm>-trtllm-python-py3`` images and the TensorRT-LLM they hold (25.12: 1.2.1,
shared/reference/trtllm-triton.md §4)."""


def image_release(image: str) -> TrtllmRelease | None:
    """The TensorRT-LLM release an image tag names: ``.../tensorrt-llm/release:1.3.0rc21`` (any registry) or a
    Triton ``<yy.mm>-trtllm-python-py3`` tag this module knows; None when the tag does not say."""
    tag = image.rsplit("/", 1)[-1].partition("@")[0]
    if ":" not in tag:
        return None
    tag = tag.split(":", 1)[1]
    triton = _TRITON_TAG_RE.fullmatch(tag)
    if triton is not None:
        return TRITON_CONTAINER_RELEASES.get(triton["yymm"])
    return TrtllmRelease.parse(tag)


LORA_SPECULATION_RELEASE = TrtllmRelease(1, 3, 0, 20)
"""The first release known to hold both PR #12661 (NGram + LoRA, merged 2026-04-01) and #13005 (Eagle3 + LoRA,
2026-04-13): 1.3.0rc20 (2026-06-30). rc10-rc19 may hold them too; not verified."""
ACCEPTANCE_CONTROLS_RELEASE = TrtllmRelease(1, 3, 0, 29)
"""The oldest API reference seen listing ``acceptance_rate_window_size`` / ``acceptance_rate_threshold`` (an
older ``llm_args.py`` calls them ``acceptance_window`` / ``acceptance_length_threshold``)."""


@dataclass(frozen=True)
class SpeculativeReleaseRule:
    """A speculative-decoding setting a runtime, a release range or the base model refuses.

    ``minimum`` None: refused whatever the release; otherwise refused below ``minimum`` and, when the image's
    tag does not name its release, refused with a request to name it.
    """

    rule_id: str
    runtime: Runtime
    applies: Callable[[BaseModelSpec], bool]
    upstream: str
    fix: str
    minimum: TrtllmRelease | None = None


def _mode_in(spec: BaseModelSpec, *modes: SpeculativeMode) -> bool:
    return spec.speculative is not None and spec.speculative.mode in modes


SPECULATIVE_RULES: tuple[SpeculativeReleaseRule, ...] = (
    SpeculativeReleaseRule(
        "lora-speculation-needs-1.3.0rc20", Runtime.PYTORCH,
        lambda s: s.lora.enabled and _mode_in(s, SpeculativeMode.NGRAM, SpeculativeMode.EAGLE3),
        "NVIDIA/TensorRT-LLM #12617 (NGram + LoRA crashes, 1.3.0rc9), fixed by PR #12661; Eagle3 + LoRA enabled "
        "by PR #13005",
        "use an image of TensorRT-LLM 1.3.0rc20 or later (engine.image), or set lora.enabled false",
        LORA_SPECULATION_RELEASE,
    ),
    SpeculativeReleaseRule(
        "acceptance-controls-need-1.3.0rc29", Runtime.PYTORCH,
        lambda s: s.speculative is not None and s.speculative.acceptance_rate_window_size is not None,
        "tensorrt_llm/llmapi/llm_args.py@00043967 (acceptance_rate_window_size, acceptance_rate_threshold); older "
        "releases spell them acceptance_window / acceptance_length_threshold and refuse these keys",
        "use an image of TensorRT-LLM 1.3.0rc29 or later, or remove speculative.acceptanceRateWindowSize and "
        "acceptanceRateThreshold",
        ACCEPTANCE_CONTROLS_RELEASE,
    ),
    SpeculativeReleaseRule(
        "medusa-needs-llama", Runtime.TENSORRTLLM,
        lambda s: _mode_in(s, SpeculativeMode.MEDUSA) and s.architecture is not Architecture.LLAMA,
        "examples/medusa README: 'TensorRT-LLM supports Medusa only for Vicuna (fine tuned LLaMA)'; the converter "
        "is examples/medusa/convert_checkpoint.py@063e02f7",
        "use architecture llama, or runtime pytorch with mode Eagle3 or NGram",
    ),
    SpeculativeReleaseRule(
        "medusa-unquantized", Runtime.TENSORRTLLM,
        lambda s: _mode_in(s, SpeculativeMode.MEDUSA) and (s.quantization.mode is not QuantizationMode.NONE
                                                           or s.quantization.kv_cache_dtype is not KvCacheDtype.AUTO),
        "trtfleet converts Medusa checkpoints with examples/medusa/convert_checkpoint.py@063e02f7 without "
        "quantization flags",
        "set quantization.mode none and kvCacheDtype auto, or use runtime pytorch",
    ),
)


def _draft_violations(spec: BaseModelSpec, base_vocab: int | None, draft_vocab: int | None) -> list[str]:
    speculative = spec.speculative
    if speculative is None or base_vocab is None or draft_vocab is None or base_vocab == draft_vocab:
        return []
    if speculative.mode not in (SpeculativeMode.DRAFT_TARGET, SpeculativeMode.PARD):
        return []
    return [
        f"[draft-vocabulary] speculative.draft has a vocabulary of {draft_vocab} tokens and the base model "
        f"{base_vocab}: mode {speculative.mode.value} needs a draft with the same tokenizer (upstream: 'make sure "
        "that the draft and target models were trained with the same tokenizer, else the acceptance rate is "
        "extremely low', docs/source/features/speculative-decoding.md@04c8822c): pick a draft of the same family"
    ]


def speculative_violations(
    spec: BaseModelSpec, *, base_vocab: int | None = None, draft_vocab: int | None = None
) -> tuple[str, ...]:
    """One message per speculative rule ``spec`` breaks on the release its ``engine.image`` names (empty: none).

    ``base_vocab`` / ``draft_vocab``: the vocabulary sizes when known (a draft must share the base's tokenizer).
    """
    if spec.speculative is None:
        return ()
    release = image_release(spec.engine.image)
    messages: list[str] = []
    for rule in SPECULATIVE_RULES:
        if spec.runtime is not rule.runtime or not rule.applies(spec):
            continue
        if rule.minimum is None:
            messages.append(f"[{rule.rule_id}] speculative.mode {spec.speculative.mode.value} is refused "
                            f"({rule.upstream}): {rule.fix}")
        elif release is None:
            messages.append(
                f"[{rule.rule_id}] engine.image {spec.engine.image!r} does not name its TensorRT-LLM release, and "
                f"this needs {rule.minimum} or later ({rule.upstream}): tag the image with its release "
                f"(nvcr.io/nvidia/tensorrt-llm/release:<version>), or {rule.fix}"
            )
        elif release.key < rule.minimum.key:
            messages.append(f"[{rule.rule_id}] engine.image holds TensorRT-LLM {release}, and this needs "
                            f"{rule.minimum} or later ({rule.upstream}): {rule.fix}")
    messages += _draft_violations(spec, base_vocab, draft_vocab)
    return tuple(messages)


def check_speculative(spec: BaseModelSpec, *, base_vocab: int | None = None, draft_vocab: int | None = None) -> None:
    """Raise :class:`ReleaseConstraintError` when the release (or the draft) refuses ``spec.speculative``."""
    messages = speculative_violations(spec, base_vocab=base_vocab, draft_vocab=draft_vocab)
    if messages:
        rule_id = messages[0][1 : messages[0].index("]")]
        raise ReleaseConstraintError(rule_id, "; ".join(messages))
