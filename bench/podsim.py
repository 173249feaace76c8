"""A simulated Triton + TensorRT-LLM pod: in-flight batching steps and the real LoRA page cache.

The pod's LoRA cache is :class:`trtfleet.loracache.LoraPageCache` itself (the contract the reference
engine implements), used the way TRT-LLM's executor uses its PEFT cache:

* on **arrival** (the executor takes the request off the wire): weights attached -> ``put`` (ignored
  when already cached; ``LoraCacheFull`` -> the "Cache is full" error), then ``acquire`` (id only and
  not cached -> the "LoRA task not found" miss); the adapter stays pinned until the request ends;
* at **scheduling** (a request joins the running batch): ``ensure_device`` copies it to the device
  tier (a host -> device copy added to that step's time); a full device tier makes it wait;
* the queue of admitted-but-not-running requests is bounded (``max_queue_size``: "queue full").

A ``pytorch`` pod (``PodSpec.read_bytes_per_s`` set: trtllm-serve, TensorRT-LLM's PyTorch backend) gets no
weights with a request: a cold adapter is read by the pod itself from its PEFT directory, one read at a time
at ``read_bytes_per_s``, and the request joins the batch only once its adapter is read. It never answers a
miss, and a full host tier is not an error: the request waits in the pod (``blocked``) until adapters are
released (:meth:`SimPod.unblock`); a full device tier makes it wait at scheduling as on TRT-LLM.

Steps follow ``guaranteed_no_evict`` in FIFO order: a waiting request joins when a batch slot, its
whole KV reservation (prompt + max_tokens), its prefill within ``max_num_tokens`` and its device pages
are available. As in TensorRT-LLM's ``GuaranteedNoEvictScheduler``
(cpp/tensorrt_llm/batch_manager/capacityScheduler.cpp@02a10fe), a request short of KV stops the scan but
one short of LoRA device pages is skipped: those pages may be held for adapters of requests queued behind it,
which must be able to run (and release them) or the pod would stall for good. Each running sequence
gains one token per step (the prefill step yields the first one).
Prefill is charged for the tokens the pod's KV cache does not already hold (``SimRequest.blocks``, block
reuse keyed by adapter: :mod:`bench.podkv`). Step time is :class:`StepTimeModel`. Everything is pure:
the simulator owns the clock and the events.

Speculative decoding (:class:`SpeculationModel` on ``PodSpec.speculation``): a running request verifies ``k``
draft tokens a step and gains ``tokens_per_step(a, k) = (1 - a^(k+1)) / (1 - a)`` tokens on average at its
adapter's acceptance rate ``a`` (:func:`trtfleet_engines.speculation.tokens_per_step`), so it needs that many
times fewer steps; each draft token costs the step what a prefill token does (``per_prefill_token_s``: the
verification runs them through the model) plus ``draft_overhead_s`` a step for the drafter. The pod reports
its running requests' mean tokens per step to the router, as a real pod's ``specDecodingStats`` do.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass, field

from trtfleet_engines.speculation import tokens_per_step

from bench.podkv import PodKvBlocks
from trtfleet.loracache import LoraCacheFull, LoraPageCache, LoraTaskNotFound


@dataclass(frozen=True, slots=True)
class StepTimeModel:
    """``step_s = fixed + per_seq * running + per_context_token * sum(context) + per_prefill_token *
    prefill + per_adapter * distinct_adapters`` (seconds)."""

    name: str
    fixed_s: float
    per_seq_s: float
    per_context_token_s: float
    per_prefill_token_s: float
    per_adapter_s: float = 0.0
    source: str = ""

    def step_s(self, running: int, context_tokens: int, prefill_tokens: int, adapters: int = 0) -> float:
        return (
            self.fixed_s
            + self.per_seq_s * running
            + self.per_context_token_s * context_tokens
            + self.per_prefill_token_s * prefill_tokens
            + self.per_adapter_s * adapters
        )


# Fitted to NVIDIA's published TensorRT-LLM figures for Llama-3.1-8B FP8 on one H100 SXM (perf-overview,
# "Llama 3.1 8B", trtllm-bench max-throughput at ISL/OSL 128/128 28,312; 128/2048 22,714; 1000/1000 15,220;
# 2048/128 3,450; 2048/2048 9,305; 5000/500 3,459 output tok/s) for the per-token terms, and the batch-1
# first-token latency of the TRT-LLM v0.5 performance page (LLaMA 7B FP8 H100: 7 ms at 128 input tokens,
# 36 ms at 2048) for the fixed step cost. See ``fit_report`` for the residuals.
H100_LLAMA3_8B = StepTimeModel(
    name="h100-llama3.1-8b-fp8",
    fixed_s=5.2e-3,
    per_seq_s=14.0e-6,
    per_context_token_s=0.025e-6,
    per_prefill_token_s=14.5e-6,
    source="TensorRT-LLM docs/source/performance/perf-overview.md (Llama 3.1 8B, H100 TP1 FP8); "
    "TensorRT-LLM v0.5 docs/source/performance.md (low latency, LLaMA 7B H100 FP8)",
)

PUBLISHED_H100_LLAMA31_8B: tuple[tuple[int, int, float], ...] = (
    (128, 128, 28_312),
    (128, 2048, 22_714),
    (128, 4096, 14_325),
    (500, 2000, 17_660),
    (1000, 1000, 15_220),
    (1000, 2000, 13_899),
    (2048, 128, 3_450),
    (2048, 2048, 9_305),
    (5000, 500, 3_459),
)


def modelled_throughput(model: StepTimeModel, isl: int, osl: int, batch: int = 4096) -> float:
    """Output tokens/s at a saturated batch of ``batch`` equal requests (steady state, amortised)."""
    mean_context = isl + osl / 2
    per_step = model.step_s(batch, int(batch * mean_context), int(batch * isl / osl))
    return batch / per_step


def fit_report(model: StepTimeModel = H100_LLAMA3_8B) -> list[tuple[int, int, float, float, float]]:
    """(ISL, OSL, published, modelled, relative error) for every published point."""
    rows = []
    for isl, osl, published in PUBLISHED_H100_LLAMA31_8B:
        modelled = modelled_throughput(model, isl, osl)
        rows.append((isl, osl, published, modelled, modelled / published - 1.0))
    return rows


@dataclass(frozen=True, slots=True)
class SpeculationModel:
    """Speculative decoding on a pod: ``draft_len`` tokens a step, each accepted with its adapter's rate."""

    draft_len: int
    acceptance: float
    """The base model's (and every adapter's without an entry of its own) acceptance rate."""
    adapter_acceptance: tuple[tuple[int, float], ...] = ()
    """(task id, acceptance rate) of adapters that differ."""
    draft_overhead_s: float = 0.0
    """Drafting time a step adds (0 for n-gram lookup; an EAGLE-3 head's forward otherwise)."""

    def rate(self, task_id: int) -> float:
        for task, rate in self.adapter_acceptance:
            if task == task_id:
                return rate
        return self.acceptance

    def tokens_per_step(self, task_id: int) -> float:
        return tokens_per_step(self.rate(task_id), self.draft_len)


@dataclass(frozen=True, slots=True)
class PodSpec:
    host_pages: int
    device_pages: int
    page_bytes: int
    max_batch_size: int = 64
    max_num_tokens: int = 8192
    kv_capacity_tokens: int = 400_000
    max_queue_size: int = 256
    host_to_device_bytes_per_s: float = 25e9  # PCIe Gen5 x16, effective
    read_bytes_per_s: float | None = None  # runtime pytorch: the pod reads cold adapters (None: sent to it)
    kv_tokens_per_block: int = 32  # KV-cache block reuse (bench/podkv.py): capacity kv_capacity_tokens / this
    speculation: SpeculationModel | None = None


@dataclass(slots=True)
class SimRequest:
    """One attempt of one trace request at a pod (the simulator owns it)."""

    key: int  # index of the trace request
    task_id: int
    prompt_tokens: int
    max_tokens: int
    with_weights: bool
    pages: int
    hit: bool = False
    loaded: bool = False
    first_token_s: float | None = None
    finished_s: float | None = None
    finish_step: int = 0
    ticket: object = None  # the router's ticket, carried for the simulator
    weights_bytes: int = 0  # runtime pytorch: what the pod reads when the adapter is cold
    ready_s: float = 0.0  # runtime pytorch: when its adapter has been read (it may join a batch)
    blocks: tuple[int, ...] = ()  # its KV blocks' chained hashes (empty: no prefix reuse modelled)
    reused_blocks: int = 0  # blocks found in the pod's KV cache at admission


class ArrivalError(Exception):
    """The pod refused a request at arrival; ``kind`` is miss, cache_full or queue_full."""

    def __init__(self, kind: str) -> None:
        super().__init__(kind)
        self.kind = kind


@dataclass(slots=True)
class SimPod:
    pod_id: str
    spec: PodSpec
    model: StepTimeModel
    cache: LoraPageCache = field(init=False)
    waiting: deque[SimRequest] = field(default_factory=deque)
    running: list[tuple[int, int, SimRequest]] = field(default_factory=list)  # heap (finish step, seq)
    step_index: int = 0
    stepping: bool = False
    context_tokens: int = 0
    reserved_tokens: int = 0
    loads_total: int = 0
    load_bytes_total: int = 0
    device_copies_total: int = 0  # host-to-device copies of adapters (a request's adapter not on the device tier)
    device_copy_bytes_total: int = 0
    busy_s: float = 0.0
    _seq: int = 0
    _new: list[SimRequest] = field(default_factory=list)
    first_tokens: list[SimRequest] = field(default_factory=list)  # whose first token the last step gave
    read_free_s: float = 0.0  # runtime pytorch: the pod's reader is busy until then
    reads_done_s: dict[int, float] = field(default_factory=dict)  # task id -> its latest read ends
    blocked: deque[SimRequest] = field(default_factory=deque)  # runtime pytorch: waiting for host pages
    kv: PodKvBlocks = field(init=False)

    def __post_init__(self) -> None:
        self.cache = LoraPageCache(self.spec.host_pages, self.spec.device_pages)
        self.kv = PodKvBlocks(self.spec.kv_capacity_tokens // self.spec.kv_tokens_per_block)

    # -- arrival ---------------------------------------------------------------------------------------
    def arrive(self, request: SimRequest, now_s: float = 0.0) -> float:
        """The executor takes ``request``: store weights, pin the adapter, queue it. Raises ArrivalError.

        Returns when it may join a batch: ``now_s``, later on a ``pytorch`` pod that reads the adapter first,
        ``math.inf`` while it waits for host pages there.
        """
        if len(self.waiting) + len(self.blocked) >= self.spec.max_queue_size:
            raise ArrivalError("queue_full")
        resident = request.task_id in self.cache
        request.hit = resident and self.reads_done_s.get(request.task_id, 0.0) <= now_s
        if self.spec.read_bytes_per_s is not None:
            if not resident and not self._try_read(request, now_s):
                self.blocked.append(request)
                return math.inf
            return self._pin(request, now_s)
        if not resident:
            if not request.with_weights:
                raise ArrivalError("miss")
            try:
                self.cache.put(request.task_id, request.pages)
            except LoraCacheFull:
                raise ArrivalError("cache_full") from None
            request.loaded = True
            self.loads_total += 1
        try:
            self.cache.acquire(request.task_id)
        except LoraTaskNotFound:  # cannot happen after put; kept for the contract
            raise ArrivalError("miss") from None
        self.waiting.append(request)
        return now_s

    def _try_read(self, request: SimRequest, now_s: float) -> bool:
        """runtime pytorch: take host pages and read the adapter after the reads before it; False: tier full."""
        assert self.spec.read_bytes_per_s is not None
        try:
            self.cache.put(request.task_id, request.pages)
        except LoraCacheFull:
            return False
        self.read_free_s = max(now_s, self.read_free_s) + request.weights_bytes / self.spec.read_bytes_per_s
        self.reads_done_s[request.task_id] = self.read_free_s
        request.loaded = True
        self.loads_total += 1
        self.load_bytes_total += request.weights_bytes
        return True

    def _pin(self, request: SimRequest, now_s: float) -> float:
        self.cache.acquire(request.task_id)
        request.ready_s = max(now_s, self.reads_done_s.get(request.task_id, 0.0))
        self.waiting.append(request)
        return request.ready_s

    def unblock(self, now_s: float) -> list[float]:
        """runtime pytorch: requests waiting for host pages take them in FIFO order; their ready times."""
        ready: list[float] = []
        while self.blocked:
            head = self.blocked[0]
            if head.task_id not in self.cache and not self._try_read(head, now_s):
                break
            self.blocked.popleft()
            ready.append(self._pin(head, now_s))
        return ready

    # -- steps -----------------------------------------------------------------------------------------
    def start_step(self, now_s: float = math.inf) -> float:
        """Admit what fits (and, on a ``pytorch`` pod, is read by ``now_s``); the step's duration (0.0: idle)."""
        spec = self.spec
        prefill = 0
        copy_bytes = 0
        admitted: list[SimRequest] = []
        budget = spec.max_num_tokens - len(self.running)
        index = 0
        while index < len(self.waiting) and len(self.running) + len(admitted) < spec.max_batch_size:
            head = self.waiting[index]
            need = head.prompt_tokens + head.max_tokens
            if head.ready_s > now_s:
                break
            held = self.kv.cached_prefix(head.blocks) if head.blocks else 0
            cached = max(0, min(head.prompt_tokens - 1, held * spec.kv_tokens_per_block))  # one token is computed
            if self.reserved_tokens + need > spec.kv_capacity_tokens or head.prompt_tokens - cached > budget - prefill:
                break
            on_device = self.cache.on_device(head.task_id)
            if not self.cache.ensure_device(head.task_id):
                index += 1  # no device pages for its adapter now: skipped, the ones behind it may still run
                continue
            if not on_device:
                copy_bytes += head.pages * spec.page_bytes
                self.device_copies_total += 1
            del self.waiting[index]
            self.reserved_tokens += need
            if head.blocks:
                head.reused_blocks = self.kv.admit(head.blocks)
            prefill += head.prompt_tokens - cached
            admitted.append(head)
        decode = len(self.running)
        if not admitted and not decode:
            self.stepping = False
            return 0.0
        adapters = len({entry[2].task_id for entry in self.running} | {r.task_id for r in admitted})
        duration = self.model.step_s(decode, self.context_tokens, prefill, adapters)
        duration += copy_bytes / spec.host_to_device_bytes_per_s
        self.device_copy_bytes_total += copy_bytes
        speculation = spec.speculation
        if speculation is not None and decode:
            duration += decode * speculation.draft_len * self.model.per_prefill_token_s + speculation.draft_overhead_s
        for request in admitted:
            decode_steps = request.max_tokens - 1
            if speculation is not None:
                decode_steps = math.ceil(decode_steps / speculation.tokens_per_step(request.task_id))
            request.finish_step = self.step_index + decode_steps
            self._seq += 1
            heapq.heappush(self.running, (request.finish_step, self._seq, request))
            self.context_tokens += request.prompt_tokens
        self._new = admitted
        self.stepping = True
        self.busy_s += duration
        return duration

    def end_step(self, now_s: float) -> list[SimRequest]:
        """The step finished at ``now_s``: first tokens for the new, one token for all; returns finished."""
        for request in self._new:
            request.first_token_s = now_s
        self.first_tokens, self._new = self._new, []
        self.context_tokens += len(self.running)
        done: list[SimRequest] = []
        while self.running and self.running[0][0] <= self.step_index:
            _step, _seq, request = heapq.heappop(self.running)
            request.finished_s = now_s
            self.context_tokens -= request.prompt_tokens + request.max_tokens
            self.reserved_tokens -= request.prompt_tokens + request.max_tokens
            self.cache.release(request.task_id)
            done.append(request)
        self.step_index += 1
        return done

    @property
    def queue_depth(self) -> int:
        return len(self.waiting) + len(self.blocked)

    @property
    def active(self) -> int:
        return len(self.running)

    def kv_used_fraction(self) -> float:
        return self.reserved_tokens / self.spec.kv_capacity_tokens

    def tokens_per_step(self) -> float | None:
        """The running requests' mean tokens per step (None without speculation or nothing running)."""
        speculation = self.spec.speculation
        if speculation is None or not self.running:
            return None
        return sum(speculation.tokens_per_step(entry[2].task_id) for entry in self.running) / len(self.running)
