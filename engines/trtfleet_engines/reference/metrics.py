"""The ``nv_trt_llm_*`` metrics of the reference engine, named and labelled as the TRT-LLM backend does.

Served on Triton's metrics port through the Python backend's custom metrics API
(``pb_utils.MetricFamily``), with the labels of TRT-LLM's ``custom_metrics_reporter``: ``model`` and
``version`` on every series plus one category label:

* ``nv_trt_llm_request_metrics{request_type=active|max|scheduled|context|waiting}``
* ``nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=max|free|used|tokens_per|reused|fraction}``
* ``nv_trt_llm_inflight_batcher_metrics{inflight_batcher_specific_metric=total_context_tokens|
  generation_requests|micro_batch_id|paused_requests}``
* ``nv_trt_llm_general_metrics{general_type=timestamp|iteration_counter}``

The KV figures come from the engine's block pool (:mod:`~trtfleet_engines.reference.kv_blocks`): ``reused``
is ``KvCacheStats.reusedBlocks``, cumulative since start, one per matched block per request, as the C++
backend reports it ("Reused KV cache blocks" in ``custom_metrics_reporter.cc`` @ 89fd9b74). ``free`` counts
cached blocks no request holds (they are evicted on demand). Like the real backend, nothing here says which
LoRA adapters are cached.

Speculative decoding: the C++ backend's metrics port has no speculative family (its per-request outputs
``acceptance_rate``, ``total_accepted_draft_tokens`` and ``total_draft_tokens`` are filled instead, by
:func:`~trtfleet_engines.reference.protocol.output_tensors`). So that a router can weigh a pod's drafts, the
reference engine adds two families of its own, only when it speculates and named as its own:

* ``trtfleet_reference_spec_decode_metrics{spec_decode_type=draft_tokens|accepted_tokens|draft_steps|
  acceptance_length|decoded_tokens_per_iter}`` - cumulative drafted and accepted tokens (trtllm-serve's
  ``trtllm_spec_decode_num_{draft,accepted}_tokens_total``) and request steps that drafted, the last
  iteration's acceptance length and tokens per generation request;
* ``trtfleet_reference_spec_decode_adapter_metrics{lora_task_id, spec_decode_type=draft_tokens|accepted_tokens}``
  - the same counts per LoRA task id (0: the base model), at most :data:`ADAPTER_SERIES_CAP` ids.

:func:`metric_values` is pure (stats -> label values); :class:`TritonMetrics` is the thin pb_utils shell.
"""

from __future__ import annotations

from typing import Any

from trtfleet_engines.reference.scheduler import BatcherStats

REQUEST_FAMILY = "nv_trt_llm_request_metrics"
KV_CACHE_FAMILY = "nv_trt_llm_kv_cache_block_metrics"
INFLIGHT_FAMILY = "nv_trt_llm_inflight_batcher_metrics"
GENERAL_FAMILY = "nv_trt_llm_general_metrics"

SPEC_FAMILY = "trtfleet_reference_spec_decode_metrics"
SPEC_ADAPTER_FAMILY = "trtfleet_reference_spec_decode_adapter_metrics"
ADAPTER_SERIES_CAP = 64
"""Per-adapter speculation series at most (the first task ids seen; the rest are not exported)."""

FAMILIES: dict[str, tuple[str, str]] = {
    REQUEST_FAMILY: ("request_type", "TRT LLM request metrics"),
    KV_CACHE_FAMILY: ("kv_cache_block_type", "TRT LLM KV cache block metrics"),
    INFLIGHT_FAMILY: ("inflight_batcher_specific_metric", "TRT LLM inflight_batcher-specific metrics"),
    GENERAL_FAMILY: ("general_type", "General TRT LLM metrics"),
    SPEC_FAMILY: ("spec_decode_type", "trtfleet reference engine: speculative decoding (not a TRT-LLM metric)"),
}


def metric_values(stats: BatcherStats, now_us: int) -> dict[tuple[str, str], float]:
    """``{(family, category label value): value}`` for one stats snapshot."""
    free = max(0, stats.kv_max_blocks - stats.kv_used_blocks)
    fraction = stats.kv_used_blocks / stats.kv_max_blocks if stats.kv_max_blocks else 0.0
    return {
        (REQUEST_FAMILY, "active"): stats.active_requests,
        (REQUEST_FAMILY, "max"): stats.max_active_requests,
        (REQUEST_FAMILY, "scheduled"): stats.scheduled_requests,
        (REQUEST_FAMILY, "context"): stats.context_requests,
        (REQUEST_FAMILY, "waiting"): stats.waiting_requests,
        (KV_CACHE_FAMILY, "max"): stats.kv_max_blocks,
        (KV_CACHE_FAMILY, "free"): free,
        (KV_CACHE_FAMILY, "used"): stats.kv_used_blocks,
        (KV_CACHE_FAMILY, "tokens_per"): stats.kv_tokens_per_block,
        (KV_CACHE_FAMILY, "reused"): stats.kv_reused_blocks,
        (KV_CACHE_FAMILY, "fraction"): fraction,
        (INFLIGHT_FAMILY, "total_context_tokens"): stats.context_tokens,
        (INFLIGHT_FAMILY, "generation_requests"): stats.generation_requests,
        (INFLIGHT_FAMILY, "micro_batch_id"): 0,
        (INFLIGHT_FAMILY, "paused_requests"): stats.paused_requests,
        (GENERAL_FAMILY, "timestamp"): now_us,
        (GENERAL_FAMILY, "iteration_counter"): stats.iterations,
    } | (_speculation_values(stats) if stats.speculative else {})


def _speculation_values(stats: BatcherStats) -> dict[tuple[str, str], float]:
    return {
        (SPEC_FAMILY, "draft_tokens"): stats.spec_draft_tokens,
        (SPEC_FAMILY, "accepted_tokens"): stats.spec_accepted_tokens,
        (SPEC_FAMILY, "draft_steps"): stats.spec_steps_with_drafts,
        (SPEC_FAMILY, "acceptance_length"): stats.spec_acceptance_length,
        (SPEC_FAMILY, "decoded_tokens_per_iter"): stats.avg_decoded_tokens_per_iter,
    }


def adapter_values(stats: BatcherStats) -> dict[tuple[int, str], float]:
    """``{(LoRA task id, spec_decode_type): value}`` of the per-adapter family (first ids, capped)."""
    out: dict[tuple[int, str], float] = {}
    for task_id, drafted, accepted in stats.spec_by_adapter[:ADAPTER_SERIES_CAP]:
        out[(task_id, "draft_tokens")] = drafted
        out[(task_id, "accepted_tokens")] = accepted
    return out


class TritonMetrics:
    """Gauges registered with Triton through ``pb_utils`` (passed in: it exists only in the stub)."""

    def __init__(self, pb_utils: Any, model: str, version: str, template: BatcherStats) -> None:
        self._families = {
            name: pb_utils.MetricFamily(name=name, description=description, kind=pb_utils.MetricFamily.GAUGE)
            for name, (_label, description) in FAMILIES.items()
        }
        self._gauges: dict[tuple[str, str], Any] = {}
        self._labels = {"model": model, "version": version}
        for family, value in metric_values(template, 0):
            label = FAMILIES[family][0]
            labels = {**self._labels, label: value}
            self._gauges[(family, value)] = self._families[family].Metric(labels=labels)
        self._adapter_family: Any = None
        self._adapter_gauges: dict[tuple[int, str], Any] = {}
        if template.speculative:
            self._adapter_family = pb_utils.MetricFamily(
                name=SPEC_ADAPTER_FAMILY, kind=pb_utils.MetricFamily.GAUGE,
                description="trtfleet reference engine: speculative decoding per LoRA task id (not a TRT-LLM metric)")

    def update(self, stats: BatcherStats, now_us: int) -> None:
        if not self._gauges:
            return  # closed
        for key, value in metric_values(stats, now_us).items():
            self._gauges[key].set(float(value))
        if self._adapter_family is None:
            return
        for (task_id, kind), value in adapter_values(stats).items():
            gauge = self._adapter_gauges.get((task_id, kind))
            if gauge is None:
                labels = {**self._labels, "lora_task_id": str(task_id), "spec_decode_type": kind}
                gauge = self._adapter_gauges[(task_id, kind)] = self._adapter_family.Metric(labels=labels)
            gauge.set(float(value))

    def close(self) -> None:
        """Delete every series and family now, while the stub can still talk to the server.

        Call from ``finalize()``. A ``pb_utils.Metric`` left to the end of the stub process is deleted while
        the stub itself is torn down, and its delete request then writes to shared memory that is gone:
        a segfault in ``Metric::SaveToSharedMemory`` on every stop (python_backend r24.10, ``src/metric.cc``
        ``Metric::~Metric`` -> ``Clear``; triton-inference-server/server#8662, fixed upstream by
        python_backend@b24c8a7d3ad30645311cd516bc8f896226e69424, which destroys the model object first).
        Series go before their families (a family deleted first leaves its series unusable).
        """
        self._adapter_gauges.clear()
        self._adapter_family = None
        self._gauges.clear()
        self._families.clear()
