"""The ``speculative`` part of a BaseModel spec: speculative decoding, declared per base model.

A mode (TensorRT-LLM's ``decoding_type`` spelling), a draft length, the draft's source when the mode drafts
with a model (staged and content-addressed like the base checkpoint), mode-specific settings and the runtime
controls that shrink or stop speculation by batch size or acceptance rate. Rules that need only this object or
the rest of the spec are CEL rules of the CRD with the same words in Python (:data:`SPECULATIVE_RULES`, checked
by :func:`check_speculative`, which :class:`~trtfleet.api.basemodel.BaseModelSpec` calls); rules that depend on
the TensorRT-LLM release the image holds live in ``trtfleet_engines.constraints``. Upstream facts and their
commits: docs/speculative-decoding.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from pydantic import Field, model_validator

from trtfleet.api.common import ApiModel, Source
from trtfleet.api.dimensions import ModelDimensions


class SpeculativeMode(StrEnum):
    """TensorRT-LLM's ``decoding_type`` names (PyTorch backend) and the legacy engine's Medusa."""

    NGRAM = "NGram"
    """Prompt lookup: drafts copied from earlier n-grams of the prompt and output; no draft model."""
    EAGLE3 = "Eagle3"
    """An EAGLE-3 head trained for the base model (``draft.source``)."""
    DRAFT_TARGET = "DraftTarget"
    """A smaller model with the same tokenizer drafts (``draft.source``)."""
    MTP = "MTP"
    """Multi-token-prediction layers inside the checkpoint (DeepSeek family); ``draft`` optional."""
    PARD = "PARD"
    """A parallel-draft model (``draft.source``)."""
    DFLASH = "DFlash"
    """A DFlash draft model (``draft.source``)."""
    SA = "SA"
    """Suffix automaton: model-free, like NGram, on the GPU."""
    MEDUSA = "Medusa"
    """Medusa heads (``draft.source``) built into the engine: runtime tensorrtllm only."""


MODEL_FREE_MODES = frozenset({SpeculativeMode.NGRAM, SpeculativeMode.SA})
"""Modes with no draft artifact: a ``draft`` is refused."""
DRAFT_MODEL_MODES = frozenset(
    {SpeculativeMode.EAGLE3, SpeculativeMode.DRAFT_TARGET, SpeculativeMode.PARD, SpeculativeMode.DFLASH,
     SpeculativeMode.MEDUSA}
)
"""Modes that need ``draft.source``."""
LORA_TESTED_MODES = frozenset({SpeculativeMode.NGRAM, SpeculativeMode.EAGLE3})
"""Modes upstream fixed or enabled for LoRA (TRT-LLM PRs #12661 and #13005); every other one needs
``allowUntestedWithLora``."""
RUNTIME_MODES: dict[str, tuple[SpeculativeMode, ...]] = {
    "pytorch": (SpeculativeMode.NGRAM, SpeculativeMode.EAGLE3, SpeculativeMode.DRAFT_TARGET, SpeculativeMode.MTP,
                SpeculativeMode.PARD, SpeculativeMode.DFLASH, SpeculativeMode.SA),
    "tensorrtllm": (SpeculativeMode.MEDUSA,),
    "reference": (SpeculativeMode.NGRAM,),
}
"""The modes each runtime serves (keys are ``Runtime`` values)."""
_RUNTIME_WHY = {
    "pytorch": "the PyTorch backend has no Medusa (TensorRT-engine only)",
    "tensorrtllm": "trtfleet builds Medusa engines only: upstream's legacy EAGLE example says 'MODEL IS NOT FULLY "
    "SUPPORTED YET! DO NOT USE IT.', and draft/target, lookahead and ReDrafter need a second engine or "
    "per-request draft tokens through the BLS model, which trtfleet does not drive; use runtime pytorch for "
    "NGram, Eagle3 or DraftTarget",
    "reference": "the reference engine drafts by prompt lookup only",
}


class DraftSpec(ApiModel):
    """The draft model or heads: staged once per content address, like the base checkpoint."""

    source: Source = Field(
        description="Where the draft checkpoint comes from (an HF-format directory: config.json + weights; Medusa "
        "heads for mode Medusa). It is staged into the model cache beside the base checkpoint and its URI and "
        "revision are part of the checkpoint's (pytorch) or engine's (tensorrtllm) content address, so pods never "
        "download it: an hf:// id here is fetched by the prepare or build Job, not by trtllm-serve."
    )
    dimensions: ModelDimensions | None = Field(
        default=None,
        description="The draft's dimensions, for capacity planning (its weights and KV cache) and for the checks "
        "that it fits the base model (same vocabulary for DraftTarget and PARD) when the operator cannot read its "
        "config.json. Unset: looked up by source URI, else the draft's weights are not planned.",
    )
    num_heads: int | None = Field(
        default=None,
        ge=1,
        le=16,
        description="Mode Medusa: the number of Medusa heads in the checkpoint (convert_checkpoint.py "
        "--num_medusa_heads); maxDraftLen may not exceed it.",
    )


class NGramSettings(ApiModel):
    """``NGramDecodingConfig`` of TensorRT-LLM; the reference engine implements the same pool."""

    max_matching_ngram_size: int = Field(
        default=2, ge=1, le=32, description="max_matching_ngram_size: the longest suffix of the sequence looked "
        "up in the n-gram pool (upstream default 2)."
    )
    is_public_pool: bool = Field(
        default=True, description="is_public_pool: one pool for every request (true, upstream default) or one per "
        "request. A public pool drafts from other requests' text, whatever their adapter."
    )
    is_keep_all: bool = Field(
        default=True, description="is_keep_all: keep every continuation seen after an n-gram (true) or only the "
        "longest."
    )
    is_use_oldest: bool = Field(
        default=True, description="is_use_oldest: propose the oldest continuation of a matched n-gram (true) or the "
        "newest."
    )


class Eagle3Settings(ApiModel):
    """``Eagle3DecodingConfig``'s dynamic tree."""

    use_dynamic_tree: bool = Field(default=False, description="use_dynamic_tree: tree-shaped drafts instead of a "
                                   "linear chain (not for sliding-window or MLA models).")
    dynamic_tree_max_top_k: int | None = Field(
        default=None, ge=1, le=64, alias="dynamicTreeMaxTopK",
        description="dynamic_tree_max_topK: candidates expanded per node; required with useDynamicTree.",
    )
    max_total_draft_tokens: int | None = Field(
        default=None, ge=1, le=4096, description="max_total_draft_tokens: the tree's token budget, between "
        "maxDraftLen and dynamicTreeMaxTopK x maxDraftLen (upstream default: their product)."
    )


class MtpSettings(ApiModel):
    """``MTPDecodingConfig``'s relaxed acceptance for reasoning models."""

    use_relaxed_acceptance_for_thinking: bool = Field(
        default=False, description="use_relaxed_acceptance_for_thinking: accept a draft token that is among the "
        "relaxedTopk candidates during the thinking phase (outputs then differ from greedy decoding)."
    )
    relaxed_topk: int = Field(default=1, ge=1, le=64, description="relaxed_topk (upstream default 1).")
    relaxed_delta: float = Field(default=0.0, ge=0, description="relaxed_delta (upstream default 0).")


class DraftLenStep(ApiModel):
    """One entry of ``draft_len_schedule``: up to ``maxBatchSize`` active requests, draft ``draftLen`` tokens."""

    max_batch_size: int = Field(ge=1, le=65536, description="The entry applies up to this many active requests.")
    draft_len: int = Field(ge=0, le=64, description="Draft length at that batch size; 0 stops speculation.")


@dataclass(frozen=True)
class SpeculativeRule:
    """One rule: its CEL text (over ``self``, the object named by its level), its message and the same check in
    Python. ``level`` "speculative" rules sit on :class:`SpeculativeSpec`, "spec" rules on ``BaseModelSpec``."""

    rule_id: str
    cel: str
    message: str
    check: Callable[[Any], bool]
    field_path: str | None = None

    def holds(self, obj: Any) -> bool:
        return bool(self.check(obj))

    def to_cel(self) -> dict[str, str]:
        out = {"rule": self.cel, "message": self.message}
        if self.field_path is not None:
            out["fieldPath"] = self.field_path
        return out


def _cel_list(modes: frozenset[SpeculativeMode] | tuple[SpeculativeMode, ...]) -> str:
    return "[" + ", ".join(f"'{mode.value}'" for mode in sorted(modes, key=lambda m: m.value)) + "]"


def _names(modes: frozenset[SpeculativeMode] | tuple[SpeculativeMode, ...]) -> str:
    return ", ".join(sorted(mode.value for mode in modes))


def _schedule_ok(spec: SpeculativeSpec) -> bool:
    schedule = spec.schedule
    if schedule is None:
        return True
    return schedule[min(schedule)] == spec.max_draft_len and all(v <= spec.max_draft_len for v in schedule.values())


SPECULATIVE_OWN_RULES: tuple[SpeculativeRule, ...] = (
    SpeculativeRule(
        "draft-required",
        f"!(self.mode in {_cel_list(DRAFT_MODEL_MODES)}) || has(self.draft)",
        f"speculative.draft is required for modes {_names(DRAFT_MODEL_MODES)}: set speculative.draft.source to the "
        "draft checkpoint (an EAGLE-3 head, a smaller model with the same tokenizer, or Medusa heads)",
        lambda s: s.mode not in DRAFT_MODEL_MODES or s.draft is not None,
        ".draft",
    ),
    SpeculativeRule(
        "no-draft-for-model-free",
        f"!(self.mode in {_cel_list(MODEL_FREE_MODES)}) || !has(self.draft)",
        f"speculative.draft is not used by modes {_names(MODEL_FREE_MODES)} (they draft from the text itself): "
        "remove speculative.draft",
        lambda s: s.mode not in MODEL_FREE_MODES or s.draft is None,
        ".draft",
    ),
    SpeculativeRule(
        "settings-match-mode",
        "(!has(self.ngram) || self.mode == 'NGram') && (!has(self.eagle3) || self.mode == 'Eagle3') && "
        "(!has(self.mtp) || self.mode == 'MTP') && (!has(self.medusaChoices) || self.mode == 'Medusa')",
        "speculative.ngram, eagle3, mtp and medusaChoices belong to modes NGram, Eagle3, MTP and Medusa: remove the "
        "settings of the other modes",
        lambda s: (s.ngram is None or s.mode is SpeculativeMode.NGRAM)
        and (s.eagle3 is None or s.mode is SpeculativeMode.EAGLE3)
        and (s.mtp is None or s.mode is SpeculativeMode.MTP)
        and (s.medusa_choices is None or s.mode is SpeculativeMode.MEDUSA),
    ),
    SpeculativeRule(
        "concurrency-or-schedule",
        "!(has(self.maxConcurrency) && has(self.draftLenSchedule))",
        "speculative.maxConcurrency and draftLenSchedule are mutually exclusive (upstream refuses both): use "
        "maxConcurrency for a plain cut-off or draftLenSchedule for draft lengths by batch size",
        lambda s: s.max_concurrency is None or s.draft_len_schedule is None,
    ),
    SpeculativeRule(
        "schedule-starts-at-max-draft-len",
        "!has(self.draftLenSchedule) || (self.draftLenSchedule.all(s, s.draftLen <= self.maxDraftLen) && "
        "self.draftLenSchedule.exists(s, s.draftLen == self.maxDraftLen && "
        "self.draftLenSchedule.all(t, t.maxBatchSize >= s.maxBatchSize)))",
        "speculative.draftLenSchedule: the entry with the smallest maxBatchSize must have draftLen equal to "
        "maxDraftLen and no entry may exceed it (upstream's draft_len_schedule rules)",
        _schedule_ok,
        ".draftLenSchedule",
    ),
    SpeculativeRule(
        "threshold-needs-window",
        "!has(self.acceptanceRateThreshold) || has(self.acceptanceRateWindowSize)",
        "speculative.acceptanceRateThreshold needs acceptanceRateWindowSize (the iterations it averages over)",
        lambda s: s.acceptance_rate_threshold is None or s.acceptance_rate_window_size is not None,
    ),
    SpeculativeRule(
        "medusa-heads",
        "self.mode != 'Medusa' || (has(self.draft) && has(self.draft.numHeads) && "
        "self.maxDraftLen <= self.draft.numHeads)",
        "mode Medusa needs speculative.draft.numHeads (the heads in the checkpoint) and maxDraftLen at most that",
        lambda s: s.mode is not SpeculativeMode.MEDUSA
        or (s.draft is not None and s.draft.num_heads is not None and s.max_draft_len <= s.draft.num_heads),
    ),
    SpeculativeRule(
        "eagle3-tree",
        "!has(self.eagle3) || !self.eagle3.useDynamicTree || has(self.eagle3.dynamicTreeMaxTopK)",
        "speculative.eagle3.useDynamicTree needs dynamicTreeMaxTopK (upstream requires it)",
        lambda s: s.eagle3 is None or not s.eagle3.use_dynamic_tree or s.eagle3.dynamic_tree_max_top_k is not None,
    ),
)
"""Rules over :class:`SpeculativeSpec` alone (CEL on that object)."""
_OWN_CEL_RULES: list[Any] = [rule.to_cel() for rule in SPECULATIVE_OWN_RULES]


class SpeculativeSpec(ApiModel):
    mode: SpeculativeMode = Field(
        description="speculative_config.decoding_type (pytorch; reference: NGram) or "
        "trtllm-build --speculative_decoding_mode medusa (tensorrtllm: Medusa)."
    )
    max_draft_len: int = Field(
        default=3, ge=1, le=64, description="max_draft_len (pytorch), trtllm-build --max_draft_len (tensorrtllm): "
        "draft tokens per request and step. Each takes a KV-cache slot and counts against engine.maxNumTokens."
    )
    draft: DraftSpec | None = Field(
        default=None,
        description="The draft checkpoint: required for Eagle3, DraftTarget, PARD, DFlash and Medusa, optional for "
        "MTP (replacement heads), refused for NGram and SA.",
    )
    ngram: NGramSettings | None = Field(default=None, description="Mode NGram only: the n-gram pool.")
    eagle3: Eagle3Settings | None = Field(default=None, description="Mode Eagle3 only: the dynamic tree.")
    mtp: MtpSettings | None = Field(default=None, description="Mode MTP only: relaxed acceptance.")
    medusa_choices: str | None = Field(
        default=None, min_length=2, max_length=4096,
        description="Mode Medusa only: the Triton tensorrt_llm model's medusa_choices tree, e.g. "
        "'{0}, {0, 0}, {1}' (unset: upstream's mc_sim_7b_63).",
    )
    max_concurrency: int | None = Field(
        default=None, ge=1, le=65536,
        description="max_concurrency: no speculation above this many active requests. Not with draftLenSchedule.",
    )
    draft_len_schedule: list[DraftLenStep] | None = Field(
        default=None, min_length=1, max_length=16,
        description="draft_len_schedule: draft length by active batch size; the smallest maxBatchSize must map to "
        "maxDraftLen, no entry above it, and above the largest maxBatchSize speculation stops.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["maxBatchSize"]},
    )
    acceptance_rate_window_size: int | None = Field(
        default=None, ge=1, le=1_000_000,
        description="acceptance_rate_window_size: decoding iterations in the rolling acceptance average.",
    )
    acceptance_rate_threshold: float | None = Field(
        default=None, ge=0, le=1,
        description="acceptance_rate_threshold: speculation stops for good once the rolling accepted / drafted "
        "tokens fall below it (needs acceptanceRateWindowSize).",
    )
    allow_untested_with_lora: bool = Field(
        default=False,
        description="Run a mode other than NGram or Eagle3 together with lora.enabled. Upstream fixed NGram + LoRA "
        "(TRT-LLM #12661) and enabled Eagle3 + LoRA (#13005); its feature matrix still calls every LoRA x "
        "speculation combination untested, and the draft never sees the adapter.",
    )

    model_config = ApiModel.model_config | {"json_schema_extra": {"x-kubernetes-validations": _OWN_CEL_RULES}}

    @property
    def schedule(self) -> dict[int, int] | None:
        """``draft_len_schedule`` as upstream's map, sorted by batch size."""
        if self.draft_len_schedule is None:
            return None
        return {step.max_batch_size: step.draft_len for step in sorted(self.draft_len_schedule,
                                                                       key=lambda s: s.max_batch_size)}

    def draft_len_at(self, active_requests: int) -> int:
        """The draft length the runtime controls allow at ``active_requests`` (before the acceptance cut-off)."""
        if self.max_concurrency is not None:
            return self.max_draft_len if active_requests <= self.max_concurrency else 0
        schedule = self.schedule
        if schedule is None:
            return self.max_draft_len
        for batch, length in schedule.items():
            if active_requests <= batch:
                return length
        return 0

    @model_validator(mode="after")
    def _own_rules(self) -> SpeculativeSpec:
        for rule in SPECULATIVE_OWN_RULES:
            if not rule.holds(self):
                raise ValueError(rule.message)
        return self


def _mode_rule(runtime: str, modes: tuple[SpeculativeMode, ...]) -> SpeculativeRule:
    def holds(spec: Any) -> bool:  # a BaseModelSpec (this module sits below basemodel.py)
        return spec.runtime.value != runtime or spec.speculative is None or spec.speculative.mode in modes

    return SpeculativeRule(
        f"mode-on-{runtime}",
        f"!(self.runtime == '{runtime}' && has(self.speculative)) || self.speculative.mode in {_cel_list(modes)}",
        f"speculative.mode on runtime {runtime} must be one of {_names(modes)} ({_RUNTIME_WHY[runtime]})",
        holds,
        ".speculative.mode",
    )


def _spec_rules() -> tuple[SpeculativeRule, ...]:
    rules = [_mode_rule(runtime, modes) for runtime, modes in RUNTIME_MODES.items()]
    rules.append(SpeculativeRule(
        "lora-untested",
        f"!(has(self.speculative) && has(self.lora) && self.lora.enabled && "
        f"!(self.speculative.mode in {_cel_list(LORA_TESTED_MODES)}) && !self.speculative.allowUntestedWithLora)",
        "speculative.mode other than NGram or Eagle3 with lora.enabled: upstream fixed NGram + LoRA (TRT-LLM #12661) "
        "and enabled Eagle3 + LoRA (#13005), and calls every other combination untested; the draft never sees the "
        "adapter. Use mode NGram or Eagle3, set lora.enabled false, or set speculative.allowUntestedWithLora true "
        "to run it anyway",
        lambda spec: spec.speculative is None or not spec.lora.enabled
        or spec.speculative.mode in LORA_TESTED_MODES or spec.speculative.allow_untested_with_lora,
        ".speculative.mode",
    ))
    rules.append(SpeculativeRule(
        "runtime-controls-not-on-engines",
        "!(self.runtime == 'tensorrtllm' && has(self.speculative) && (has(self.speculative.maxConcurrency) || "
        "has(self.speculative.draftLenSchedule) || has(self.speculative.acceptanceRateWindowSize)))",
        "speculative.maxConcurrency, draftLenSchedule and acceptanceRate* are PyTorch-backend controls: runtime "
        "tensorrtllm has none (remove them, or use runtime pytorch)",
        lambda spec: spec.runtime.value != "tensorrtllm" or spec.speculative is None
        or (spec.speculative.max_concurrency is None and spec.speculative.draft_len_schedule is None
            and spec.speculative.acceptance_rate_window_size is None),
    ))
    return tuple(rules)


SPEC_RULES: tuple[SpeculativeRule, ...] = _spec_rules()
"""Rules over ``BaseModelSpec`` that involve ``speculative`` (CEL on the spec)."""
SPECULATIVE_RULES: tuple[SpeculativeRule, ...] = SPECULATIVE_OWN_RULES + SPEC_RULES


def check_speculative(spec: Any) -> None:
    """Raise ``ValueError`` with the CEL message of the first spec-level rule ``spec`` (a ``BaseModelSpec``)
    breaks."""
    for rule in SPEC_RULES:
        if not rule.holds(spec):
            raise ValueError(rule.message)

