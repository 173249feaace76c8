"""Speculative decoding as the capacity planners and the prepare Job see it (pure).

* :func:`plan_speculation` - what ``spec.speculative`` costs one GPU: the draft's weights (a draft model from its
  dimensions; Medusa heads; an EAGLE-3 head estimated as one decoder layer of the base plus its fusion and
  output layers when its dimensions are unknown; nothing for NGram, SA and MTP), the draft model's KV bytes per
  cached token, the KV slots a full batch's draft tokens hold, and how many requests one step can verify within
  ``max_num_tokens`` when each brings ``1 + maxDraftLen`` tokens (upstream: draft tokens "take up extra KV cache
  pages and count towards the executor's ``max_num_tokens`` limit").
* :func:`draft_problems` - whether a staged draft fits the model, from both ``config.json`` files and tokenizers:
  DraftTarget and PARD need the base's vocabulary and tokenizer, an EAGLE-3 head the base's hidden size.
* :func:`speculative_config` - the LLM-API ``speculative_config`` block (``trtllm-serve --config``, Triton's
  ``model.yaml``, and the reference engine on both its faces).
* :func:`tokens_per_step` - expected tokens a request gains per verification step at acceptance rate ``a``
  and draft length ``k`` (each draft token accepted independently with probability ``a``, stopping at the first
  rejection; the verification always adds one token of its own): ``(1 - a^(k+1)) / (1 - a)``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from trtfleet.api.basemodel import BaseModelSpec, ModelDimensions, Runtime, SpeculativeMode
from trtfleet.api.speculative import DRAFT_MODEL_MODES, NGramSettings
from trtfleet_engines.errors import EnginesError, SpecError
from trtfleet_engines.modeldims import ResolvedDimensions, builtin_dimensions, dimensions_from_config

DTYPE_BYTES = 2
"""Drafts run in the engine dtype (float16 / bfloat16)."""
EAGLE3_FUSED_LAYERS = 3
"""An EAGLE-3 head fuses three of the target's hidden states (``fc``: 3 x hidden -> hidden)."""
KV_DRAFT_MODES = frozenset({SpeculativeMode.DRAFT_TARGET, SpeculativeMode.EAGLE3, SpeculativeMode.PARD,
                            SpeculativeMode.DFLASH})
"""Modes whose draft model keeps a KV cache of its own."""


@dataclass(frozen=True)
class SpeculationPlan:
    mode: SpeculativeMode
    max_draft_len: int
    draft_weights_bytes: int
    draft_kv_bytes_per_token: int
    draft_kv_cache_tokens: int
    decode_requests_per_step: int
    draft_dimensions_source: str | None
    warnings: tuple[str, ...]

    def to_json_dict(self) -> dict[str, Any]:
        return {"mode": self.mode.value, "maxDraftLen": self.max_draft_len,
                "draftWeightsBytes": self.draft_weights_bytes,
                "draftKvBytesPerToken": self.draft_kv_bytes_per_token,
                "draftKvCacheTokens": self.draft_kv_cache_tokens,
                "decodeRequestsPerStep": self.decode_requests_per_step,
                "draftDimensionsSource": self.draft_dimensions_source, "warnings": list(self.warnings)}


def _draft_dimensions(spec: BaseModelSpec) -> tuple[ModelDimensions | None, str | None]:
    speculative = spec.speculative
    if speculative is None or speculative.draft is None:
        return None, None
    if speculative.draft.dimensions is not None:
        return speculative.draft.dimensions, "speculative.draft.dimensions"
    found = builtin_dimensions(speculative.draft.source.uri)
    return (found.dims, "built-in table") if found is not None else (None, None)


def _decoder_params(dims: ModelDimensions, layers: int) -> int:
    head = dims.head_size
    attention = 2 * dims.hidden_size * head * (dims.num_attention_heads + dims.num_kv_heads)
    mlp = 3 * dims.hidden_size * dims.intermediate_size
    return layers * (attention + mlp + 2 * dims.hidden_size)


def _model_params(dims: ModelDimensions) -> int:
    return _decoder_params(dims, dims.num_layers) + 2 * dims.vocab_size * dims.hidden_size + dims.hidden_size


def _kv_bytes_per_token(dims: ModelDimensions, layers: int, tensor: int) -> int:
    return 2 * layers * math.ceil(dims.num_kv_heads / tensor) * dims.head_size * DTYPE_BYTES


def plan_speculation(spec: BaseModelSpec, base: ResolvedDimensions) -> SpeculationPlan | None:
    """The per-GPU cost of ``spec.speculative`` on a model of ``base`` dimensions (None without speculation)."""
    speculative = spec.speculative
    if speculative is None:
        return None
    mode, k, tensor = speculative.mode, speculative.max_draft_len, spec.parallelism.tensor
    dims, source = _draft_dimensions(spec)
    warnings: list[str] = []
    params = 0
    kv_per_token = 0
    if mode is SpeculativeMode.MEDUSA:
        heads = speculative.draft.num_heads if speculative.draft and speculative.draft.num_heads else k
        hidden, vocab = base.dims.hidden_size, base.dims.vocab_size
        params = heads * (hidden * hidden + hidden + hidden * vocab)
        source = "base dimensions (Medusa heads: a residual block and an lm_head each)"
    elif mode in KV_DRAFT_MODES and dims is not None:
        params = _model_params(dims)
        kv_per_token = _kv_bytes_per_token(dims, dims.num_layers, tensor)
    elif mode is SpeculativeMode.EAGLE3:
        b = base.dims
        fused = EAGLE3_FUSED_LAYERS * b.hidden_size * b.hidden_size
        params = _decoder_params(b, 1) + fused + b.hidden_size * b.vocab_size
        kv_per_token = _kv_bytes_per_token(b, 1, tensor)
        source = "estimate: one decoder layer of the base model plus the EAGLE-3 fusion and output layers"
    elif mode in KV_DRAFT_MODES:
        warnings.append(
            f"speculative.draft's weights and KV cache are not planned (mode {mode.value}): set "
            "speculative.draft.dimensions from the draft's config.json"
        )
    weights = math.ceil(params * DTYPE_BYTES / tensor)
    per_step = spec.engine.max_num_tokens // (1 + k)
    requests = min(spec.engine.max_batch_size, per_step)
    if per_step < spec.engine.max_batch_size:
        warnings.append(
            f"engine.maxNumTokens {spec.engine.max_num_tokens} lets one step verify {per_step} requests with "
            f"{k} draft tokens each, fewer than engine.maxBatchSize {spec.engine.max_batch_size}: raise "
            f"engine.maxNumTokens to {spec.engine.max_batch_size * (1 + k)} or lower speculative.maxDraftLen"
        )
    return SpeculationPlan(mode, k, weights, kv_per_token, spec.engine.max_batch_size * k, requests, source,
                           tuple(warnings))


def tokens_per_step(acceptance_rate: float, draft_len: int) -> float:
    """Expected tokens per verification step: ``sum_{i=0..k} a^i`` (1 + accepted drafts)."""
    a = min(max(acceptance_rate, 0.0), 1.0)
    if draft_len < 1:
        return 1.0
    if a >= 1.0:
        return float(draft_len + 1)
    return (1.0 - a ** (draft_len + 1)) / (1.0 - a)


def _architectures(config: Mapping[str, Any]) -> list[str]:
    value = config.get("architectures")
    return [str(item) for item in value] if isinstance(value, list) else []


def draft_problems(
    mode: SpeculativeMode,
    base_config: Mapping[str, Any],
    draft_config: Mapping[str, Any],
    *,
    base_tokenizer: Mapping[str, Any] | None = None,
    draft_tokenizer: Mapping[str, Any] | None = None,
) -> list[str]:
    """Why a staged draft does not fit the model (empty: it fits). Configs are ``config.json`` mappings, the
    tokenizers ``tokenizer.json`` mappings when both checkpoints have one."""
    problems: list[str] = []
    if mode in (SpeculativeMode.DRAFT_TARGET, SpeculativeMode.PARD):
        base_vocab, draft_vocab = base_config.get("vocab_size"), draft_config.get("vocab_size")
        if base_vocab is not None and draft_vocab is not None and base_vocab != draft_vocab:
            problems.append(
                f"the draft's vocabulary has {draft_vocab} tokens and the model's {base_vocab}: mode {mode.value} "
                "needs a draft trained with the model's tokenizer (pick a smaller model of the same family)"
            )
        elif base_tokenizer is not None and draft_tokenizer is not None and \
                base_tokenizer.get("model") != draft_tokenizer.get("model"):
            problems.append(
                f"the draft's tokenizer.json maps tokens differently from the model's: mode {mode.value} needs a "
                "draft trained with the model's tokenizer (pick a smaller model of the same family)"
            )
    if mode is SpeculativeMode.EAGLE3:
        names = _architectures(draft_config)
        if names and not any("eagle" in name.lower() for name in names):
            problems.append(
                f"the draft's config.json names architectures {names}, not an EAGLE-3 head: mode Eagle3 needs a "
                "head trained for this model (e.g. yuhuili/EAGLE3-* or nvidia/*-Eagle3)"
            )
        try:
            base_hidden = dimensions_from_config(base_config).dims.hidden_size
        except EnginesError:
            base_hidden = None
        draft_hidden = draft_config.get("hidden_size")
        if base_hidden is not None and draft_hidden is not None and draft_hidden != base_hidden:
            problems.append(
                f"the EAGLE-3 head's hidden_size is {draft_hidden} and the model's {base_hidden}: the head reads "
                "the model's hidden states, so it must be the head trained for this model"
            )
    return problems


def vocabularies(spec: BaseModelSpec) -> tuple[int | None, int | None]:
    """(the base's, the draft's) vocabulary sizes where the spec or the built-in table says them."""
    base: int | None = None
    if spec.dimensions is not None:
        base = spec.dimensions.vocab_size
    else:
        found = builtin_dimensions(spec.source.uri)
        base = found.dims.vocab_size if found is not None else None
    draft, _source = _draft_dimensions(spec)
    return base, draft.vocab_size if draft is not None else None


def _draft_dir(spec: BaseModelSpec, draft_dir: str | None) -> str | None:
    """The directory ``speculative_model`` names: the staged draft, or a reference spec's file:// source."""
    speculative = spec.speculative
    if speculative is None or speculative.draft is None:
        return None
    if draft_dir is not None:
        return draft_dir
    uri = speculative.draft.source.uri
    if spec.runtime is Runtime.REFERENCE and uri.startswith("file://"):
        return uri.removeprefix("file://")
    if speculative.mode in DRAFT_MODEL_MODES:
        raise SpecError(
            f"speculative.mode {speculative.mode.value} reads the draft from its staged directory: plan the prepare "
            "Job (plan_prepare) and pass its draft directory"
        )
    return None


def speculative_config(spec: BaseModelSpec, draft_dir: str | None = None) -> dict[str, Any] | None:
    """``speculative_config`` of ``spec`` (None without ``spec.speculative``); every key upstream's config class
    spells, the mode's settings rendered in full so the file says exactly what runs."""
    speculative = spec.speculative
    if speculative is None:
        return None
    config: dict[str, Any] = {"decoding_type": speculative.mode.value, "max_draft_len": speculative.max_draft_len}
    model_dir = _draft_dir(spec, draft_dir)
    if model_dir is not None:
        config["speculative_model"] = model_dir
    if speculative.mode is SpeculativeMode.NGRAM:
        ngram = speculative.ngram or NGramSettings()
        config |= {"max_matching_ngram_size": ngram.max_matching_ngram_size, "is_public_pool": ngram.is_public_pool,
                   "is_keep_all": ngram.is_keep_all, "is_use_oldest": ngram.is_use_oldest}
    if speculative.eagle3 is not None:
        config["use_dynamic_tree"] = speculative.eagle3.use_dynamic_tree
        if speculative.eagle3.dynamic_tree_max_top_k is not None:
            config["dynamic_tree_max_topK"] = speculative.eagle3.dynamic_tree_max_top_k
        if speculative.eagle3.max_total_draft_tokens is not None:
            config["max_total_draft_tokens"] = speculative.eagle3.max_total_draft_tokens
    if speculative.mtp is not None:
        config |= {"use_relaxed_acceptance_for_thinking": speculative.mtp.use_relaxed_acceptance_for_thinking,
                   "relaxed_topk": speculative.mtp.relaxed_topk, "relaxed_delta": speculative.mtp.relaxed_delta}
    if speculative.max_concurrency is not None:
        config["max_concurrency"] = speculative.max_concurrency
    if speculative.schedule is not None:
        config["draft_len_schedule"] = speculative.schedule
    if speculative.acceptance_rate_window_size is not None:
        config["acceptance_rate_window_size"] = speculative.acceptance_rate_window_size
    if speculative.acceptance_rate_threshold is not None:
        config["acceptance_rate_threshold"] = speculative.acceptance_rate_threshold
    return config
