"""Served names -> base model / adapter, with the limits and chat template of each (pure).

A :class:`ModelRegistry` is an immutable snapshot built by discovery (static config or Kubernetes);
the router swaps the whole snapshot when something changes, so a request sees one consistent view.

Prompt lengths: the router has no tokenizer (tokenizers are model-specific and live with the engine),
so it *estimates* prompt tokens as ``ceil(utf8_bytes / bytes_per_token)``. ``bytes_per_token`` is 1.0
for the reference runtime (its byte-level tokenizer makes the estimate exact up to two special tokens)
and 4.0 otherwise (a typical English average). The check only rejects what the estimate says is too
long; the engine stays the final authority and its own refusal reaches the client as a 400.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Final

from trtfleet.api.basemodel import BaseModelSpec, BaseModelStatus, Dtype, Runtime, ServingServer, WaitingQueuePolicy
from trtfleet.loracache import (
    declared_geometry,
    tier_pages,
)
from trtfleet_router.chat import ChatRenderer, chat_renderer
from trtfleet_router.errors import LimitExceeded, ModelNotFound
from trtfleet_router.routing.prefix import (
    BLOCK_TOKENS_DEFAULT,
    PromptBlocks,
    payload_block_hashes,
    reference_prompt_payload,
    text_block_hashes,
)
from trtfleet_router.routing.types import AdapterRef

DEFAULT_UPSTREAM_MODEL: Final = "tensorrt_llm_bls"
LLMAPI_UPSTREAM_MODEL: Final = "tensorrt_llm"
"""TRT-LLM's llmapi model (``runtime: pytorch``, ``serving.server: triton``): one prompt a request, no batch dim."""
BYTES_PER_TOKEN_REFERENCE: Final = 1.0
BYTES_PER_TOKEN_DEFAULT: Final = 4.0
PROMPT_SPECIAL_TOKENS: Final = 2
"""Tokens an engine adds around a prompt (BOS/separator); counted in the estimate."""
DEFAULT_MAX_TOKENS: Final = 256
MERGED_FLEET_SUFFIX: Final = "@merged"
VARIANT_FLEET_SUFFIX: Final = "@variant"
DEFAULT_CACHE_PAGES: Final = 8


@dataclass(frozen=True, slots=True)
class EngineLimits:
    max_input_tokens: int
    max_sequence_tokens: int


@dataclass(frozen=True, slots=True)
class BaseModelEntry:
    """One base model: how to reach it upstream and what it accepts."""

    name: str
    architecture: str
    limits: EngineLimits
    chat: ChatRenderer
    upstream_model: str = DEFAULT_UPSTREAM_MODEL
    weights_datatype: str = "FP16"
    bytes_per_token: float = BYTES_PER_TOKEN_DEFAULT
    host_pages: int = DEFAULT_CACHE_PAGES
    device_pages: int = DEFAULT_CACHE_PAGES
    default_max_tokens: int = DEFAULT_MAX_TOKENS
    batched: bool = True
    """The upstream model has ``max_batch_size > 0``: tensors carry a leading batch dim of 1."""
    runtime: Runtime = Runtime.TENSORRTLLM
    kv_tokens_per_block: int = BLOCK_TOKENS_DEFAULT
    """TensorRT-LLM's tokens_per_block: the size of the KV blocks the router hashes (routing/prefix.py)."""
    kv_cache_tokens: int = 0
    """KV-cache tokens per pod from the capacity plan (status.capacity.kvCacheTokens); 0: unknown."""
    weights_bytes: int = 0
    """Weight bytes per GPU (status.capacity.weightsBytes plus draftWeightsBytes); 0: unknown."""
    kv_bytes_per_token: int = 0
    """KV-cache bytes per token per GPU (status.capacity.kvBytesPerToken); 0: unknown."""
    memory_bandwidth_bytes_per_s: float = 0.0
    """The GPU's peak memory bandwidth (status.capacity.memoryBandwidthBytesPerSecond); 0: unknown, no MBU."""
    """``pytorch``: the pods run trtllm-serve (OpenAI API, adapters read from ``lora_path`` by the pod);
    else Triton (``tensorrtllm``, ``reference``)."""
    server: ServingServer | None = None
    """``spec.serving.server``: with ``pytorch``, ``triton`` pods run TRT-LLM's llmapi model instead."""
    replaces: str | None = None
    """``spec.serving.replaces``: the BaseModel whose served names this one takes over (a migration)."""
    merged_adapter: str | None = None
    """Adapter ``mode: merged``: this fleet's pods serve the adapter of this served name folded into the
    weights of base model ``merged_base`` (no LoRA inputs); see :func:`merged_entry`."""
    merged_base: str | None = None
    variant_of: str | None = None
    """QLoRA base variant: this fleet's pods serve base model ``variant_of`` dequantized as bitsandbytes does;
    only the adapters trained on that quantization are routed here (see :func:`variant_entry`)."""
    hold_release_per_pod: float | None = None
    """``spec.autoscaling.targetRequestsPerPod``: held requests released per ready pod (else the routing config's)."""
    engine_priority: bool = False
    """``spec.serving.waitingQueuePolicy: priority`` (trtllm-serve pods): requests carry their band as ``priority``."""

    @property
    def upstream_name(self) -> str:
        """The model name the pods serve: the merged adapter's served name, else the base model's."""
        return self.merged_adapter or self.variant_of or self.name

    @property
    def own_fleet(self) -> bool:
        """A fleet reached only through its adapters' names (merged adapters, QLoRA base variants)."""
        return self.merged_adapter is not None or self.variant_of is not None

    @property
    def serves_openai(self) -> bool:
        """The pods speak trtllm-serve's OpenAI API, not Triton's."""
        return self.runtime is Runtime.PYTORCH and not self.serves_llmapi

    @property
    def serves_llmapi(self) -> bool:
        """The pods run Triton with TRT-LLM's llmapi model (``runtime: pytorch``, ``serving.server: triton``)."""
        return self.runtime is Runtime.PYTORCH and self.server is ServingServer.TRITON

    def prompt_blocks(self, text: str, task_id: int) -> PromptBlocks:
        """The prompt's chained KV block hashes for the routing core, computed when first read (only policies
        that price prefixes read them): exact token blocks for the reference runtime's byte-level tokenizer,
        else character chunks of ``bytes_per_token`` characters a token."""
        block_tokens = self.kv_tokens_per_block
        if self.bytes_per_token == BYTES_PER_TOKEN_REFERENCE:
            return PromptBlocks.lazy(
                lambda: payload_block_hashes(reference_prompt_payload(text), task_id, block_tokens).hashes,
                block_tokens, True,
            )
        chars_per_token = self.bytes_per_token
        return PromptBlocks.lazy(
            lambda: text_block_hashes(text, task_id, block_tokens, chars_per_token).hashes, block_tokens, False
        )

    @property
    def kv_blocks(self) -> int:
        """KV-cache blocks per pod from the capacity plan (0: unknown, the routing default applies)."""
        return self.kv_cache_tokens // self.kv_tokens_per_block

    def estimate_tokens(self, text: str) -> int:
        return math.ceil(len(text.encode("utf-8")) / self.bytes_per_token) + PROMPT_SPECIAL_TOKENS

    def resolve_max_tokens(self, prompt_tokens: int, requested: int | None) -> int:
        """Check the prompt and ``max_tokens`` against the engine limits; the max_tokens to send."""
        limits = self.limits
        if prompt_tokens > limits.max_input_tokens:
            raise LimitExceeded(
                f"the prompt has about {prompt_tokens} tokens but model '{self.name}' accepts at most "
                f"{limits.max_input_tokens} input tokens (maxInputLen)",
                param="prompt",
                code="context_length_exceeded",
            )
        room = limits.max_sequence_tokens - prompt_tokens
        if requested is None:
            return max(1, min(self.default_max_tokens, room))
        if requested < 1:
            raise LimitExceeded("max_tokens must be at least 1", param="max_tokens")
        if requested > room:
            raise LimitExceeded(
                f"max_tokens {requested} plus about {prompt_tokens} prompt tokens exceed the "
                f"model '{self.name}' maxSeqLen of {limits.max_sequence_tokens} "
                f"(at most {room} new tokens for this prompt)",
                param="max_tokens",
                code="context_length_exceeded",
            )
        return requested


@dataclass(frozen=True, slots=True)
class AdapterEntry:
    """One LoRA adapter served on a base model under ``served_name``."""

    served_name: str
    base_model: str
    task_id: int
    artifact_uri: str
    sha256: str | None = None
    weights_bytes: int = 0
    pages: int = 1
    min_pods: int = 0
    lora_path: str = ""
    """runtime pytorch: the PEFT directory as the pods see it (``lora_request.lora_path``); the pod reads
    the adapter from there on a miss. Empty: the adapter's weights travel with the request (Triton)."""
    ref: AdapterRef = field(init=False, compare=False)

    def __post_init__(self) -> None:
        ref = AdapterRef(
            name=self.served_name,
            task_id=self.task_id,
            weights_bytes=self.weights_bytes,
            pages=self.pages,
            min_pods=self.min_pods,
            read_by_pod=bool(self.lora_path),
        )
        object.__setattr__(self, "ref", ref)


@dataclass(frozen=True, slots=True)
class Target:
    """What a request's ``model`` resolved to.

    ``fallback``: during a migration (``spec.serving.replaces``) the same name on the BaseModel being
    replaced; for a merged adapter (``base.merged_adapter``) the adapter hot-swapped on its base model's
    pool. The front ends use it while this target's base model has no pod to take the request.
    """

    base: BaseModelEntry
    adapter: AdapterEntry | None
    fallback: Target | None = None

    @property
    def model_kind(self) -> str:
        return "base" if self.adapter is None else "adapter"

    @property
    def served_name(self) -> str:
        return self.base.upstream_name if self.adapter is None else self.adapter.served_name


class ModelRegistry:
    """Immutable lookup of served names. Base model names win over adapters with the same name.

    Migration: a base model whose ``replaces`` names another takes over that one's name and the served
    names of adapters both carry (the replaced one's entries become the targets' ``fallback``); once
    the replaced base model is gone, its name stays an alias of its successor.

    Merged adapters: an entry with ``merged_adapter`` is a fleet of its own (in :attr:`bases`, never a
    served name itself) that takes its adapter's served name, with the adapter's dynamic target on the
    shared pool, when there is one, as the ``fallback``.

    QLoRA base variants: an entry with ``variant_of`` is a fleet of its own too (never a served name); the
    adapters whose ``base_model`` names it are served there and nowhere else (no fallback: the plain base
    would give other activations), so while it has no ready pod their requests get 503 with Retry-After.
    """

    def __init__(self, bases: Iterable[BaseModelEntry] = (), adapters: Iterable[AdapterEntry] = ()) -> None:
        self.bases: Mapping[str, BaseModelEntry] = {b.name: b for b in bases}
        kept = [a for a in adapters if a.base_model in self.bases and a.served_name not in self.bases]
        self._by_task: Mapping[tuple[str, int], AdapterEntry] = {(a.base_model, a.task_id): a for a in kept}
        successors = _successors(self.bases.values())
        self.aliases: Mapping[str, str] = {old: new for old, new in successors.items() if old not in self.bases}
        """Names of replaced base models that are gone -> the base model now serving them."""
        self._targets: dict[str, Target] = {
            name: Target(b, None) for name, b in self.bases.items() if not b.own_fleet
        }
        for old, new in successors.items():
            replaced = self._targets.get(old)
            self._targets[old] = Target(self.bases[new], None, fallback=replaced)
        primary: dict[str, AdapterEntry] = {}
        for a in kept:
            if a.served_name in self._targets and self._targets[a.served_name].adapter is None:
                continue  # a base model's alias keeps its name
            held = primary.get(a.served_name)
            if held is None or successors.get(a.base_model) != held.base_model:
                primary[a.served_name] = a  # later entries win, except over their own successor's
        self.adapters: Mapping[str, AdapterEntry] = primary
        predecessors = {new: old for old, new in successors.items()}
        by_base_and_name = {(a.base_model, a.served_name): a for a in kept}
        for name, a in primary.items():
            twin = by_base_and_name.get((predecessors.get(a.base_model, ""), name))
            fallback = Target(self.bases[twin.base_model], twin) if twin is not None else None
            self._targets[name] = Target(self.bases[a.base_model], a, fallback=fallback)
        merged: dict[str, BaseModelEntry] = {}
        for entry in sorted(self.bases.values(), key=lambda b: b.name):
            served = entry.merged_adapter
            dynamic = self._targets.get(served) if served is not None else None
            if served is None or (dynamic is not None and dynamic.adapter is None):
                continue  # not merged, or a base model's own name: it keeps it
            self._targets[served] = Target(entry, None, fallback=dynamic)
            merged[served] = entry
        self.merged: Mapping[str, BaseModelEntry] = merged
        """Served names whose requests go first to a merged fleet."""

    def served_bases(self) -> list[str]:
        """Base model names clients may send (merged fleets are reached by their adapter's name)."""
        return [name for name, b in self.bases.items() if not b.own_fleet]

    def resolve(self, name: str) -> Target:
        target = self._targets.get(name)
        if target is None:
            raise ModelNotFound(f"The model '{name}' does not exist", param="model", code="model_not_found")
        return target

    def adapter_by_task(self, base_model: str, task_id: int) -> AdapterEntry:
        adapter = self._by_task.get((base_model, task_id))
        if adapter is None:
            raise ModelNotFound(
                f"no adapter with lora_task_id {task_id} is served on base model '{base_model}'",
                param="lora_task_id",
                code="model_not_found",
            )
        return adapter

    def adapters_of(self, base_model: str) -> list[AdapterEntry]:
        """Every adapter served on ``base_model`` (also those whose name routes elsewhere first)."""
        return [a for (base, _), a in self._by_task.items() if base == base_model]

    def served_names(self) -> list[str]:
        return sorted(self._targets)


def merged_fleet_name(served_name: str) -> str:
    """The fleet (registry base entry) of a merged adapter's pods; never a valid served name of its own."""
    return f"{served_name}{MERGED_FLEET_SUFFIX}"


def merged_entry(base: BaseModelEntry, served_name: str) -> BaseModelEntry:
    """The fleet of adapter ``served_name`` merged into ``base``: the same limits, chat template and
    runtime, its own pods. Its requests carry no adapter, so the shared pool's LoRA cache plays no part."""
    return replace(
        base, name=merged_fleet_name(served_name), merged_adapter=served_name, merged_base=base.name, replaces=None
    )


def variant_fleet_name(variant: str) -> str:
    """The fleet of a QLoRA base variant's pods (``variant``: its Deployment's name); never a served name."""
    return f"{variant}{VARIANT_FLEET_SUFFIX}"


def variant_entry(base: BaseModelEntry, variant: str) -> BaseModelEntry:
    """The fleet of QLoRA base variant ``variant`` of ``base``: the same limits, chat template, runtime and
    LoRA cache, its own pods, which serve the base model's name."""
    return replace(base, name=variant_fleet_name(variant), variant_of=base.name, replaces=None)


def _successors(bases: Iterable[BaseModelEntry]) -> dict[str, str]:
    """Replaced base model name -> the base model replacing it (the first by name when several claim it;
    a base model cannot replace itself nor one that replaces something in turn)."""
    claims = sorted((b.replaces, b.name) for b in bases if b.replaces and b.replaces != b.name)
    successors: dict[str, str] = {}
    for old, new in claims:
        successors.setdefault(old, new)
    return {old: new for old, new in successors.items() if old not in successors.values()}


# -- builders from the API types ----------------------------------------------------------------------


def base_entry_from_spec(
    name: str,
    spec: BaseModelSpec,
    status: BaseModelStatus | None = None,
    *,
    upstream_model: str = DEFAULT_UPSTREAM_MODEL,
    host_pages: int | None = None,
    device_pages: int | None = None,
) -> BaseModelEntry:
    """A registry entry from a BaseModel: limits from ``spec.engine``, pages from ``status.capacity``
    (else planned from ``spec.dimensions``), chat template from ``spec.serving.chatTemplate``."""
    reference = spec.runtime is Runtime.REFERENCE
    llmapi = spec.runtime is Runtime.PYTORCH and spec.serving.server is ServingServer.TRITON
    if llmapi and upstream_model == DEFAULT_UPSTREAM_MODEL:
        upstream_model = LLMAPI_UPSTREAM_MODEL
    capacity = status.capacity if status is not None else None
    geometry = declared_geometry(spec)
    if host_pages is None:
        host_pages = capacity.lora_host_pages if capacity and capacity.lora_host_pages else None
    if host_pages is None and geometry is not None:
        host_pages = tier_pages(geometry, spec.lora.cache.host_bytes)
    if device_pages is None:
        device_pages = capacity.lora_device_pages if capacity and capacity.lora_device_pages else None
    return BaseModelEntry(
        name=name,
        architecture="reference" if reference else spec.architecture.value,
        limits=EngineLimits(spec.engine.max_input_len, spec.engine.max_seq_len),
        chat=chat_renderer("reference" if reference else spec.architecture.value, spec.serving.chat_template),
        upstream_model=upstream_model,
        weights_datatype="BF16" if spec.dtype is Dtype.BFLOAT16 else "FP16",
        bytes_per_token=BYTES_PER_TOKEN_REFERENCE if reference else BYTES_PER_TOKEN_DEFAULT,
        host_pages=host_pages or DEFAULT_CACHE_PAGES,
        device_pages=device_pages or host_pages or DEFAULT_CACHE_PAGES,
        batched=not llmapi,
        runtime=spec.runtime,
        server=spec.serving.server,
        replaces=spec.serving.replaces,
        kv_cache_tokens=(capacity.kv_cache_tokens or 0) if capacity is not None else 0,
        weights_bytes=((capacity.weights_bytes or 0) + (capacity.draft_weights_bytes or 0)) if capacity else 0,
        kv_bytes_per_token=(capacity.kv_bytes_per_token or 0) if capacity is not None else 0,
        memory_bandwidth_bytes_per_s=(capacity.memory_bandwidth_bytes_per_second or 0.0) if capacity else 0.0,
        hold_release_per_pod=spec.autoscaling.target_requests_per_pod if spec.autoscaling is not None else None,
        engine_priority=spec.serving.waiting_queue_policy is WaitingQueuePolicy.PRIORITY,
    )
