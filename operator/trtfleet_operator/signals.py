"""Demand signals of a base model from the metrics the operator scrapes (pure: text in, numbers out).

Sources, and what each one says (see docs/operations.md, "Autoscaling"):

* every router replica's Prometheus ``/metrics``: ``trtfleet_router_base_model_requests`` (in the router:
  at a pod, waiting for LoRA cache capacity, or held), ``trtfleet_router_held_requests`` (held for want
  of a ready pod) and ``trtfleet_router_active_adapter_pages`` (LoRA pages of the adapters active in the
  router's window), each labelled ``base_model``. Each replica counts only its own requests, so the sums
  over replicas are exact; the active adapter pages are summed too, an upper bound when several
  replicas see the same adapter (it errs towards more pods);
* each serving pod's own metrics: Triton's Prometheus text (``nv_trt_llm_request_metrics``
  ``request_type`` active and waiting, ``nv_trt_llm_kv_cache_block_metrics`` ``kv_cache_block_type``
  fraction), or trtllm-serve's JSON ``/metrics`` (a list of iteration stats; the newest entry's
  ``numActiveRequests`` + ``numQueuedRequests`` and ``kvCacheStats`` used/max blocks).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from trtfleet.autoscaling import DemandSignals
from trtfleet.demand import MetricsParseError as MetricsParseError
from trtfleet.demand import RouterReading as RouterReading
from trtfleet.demand import parse_router_metrics as parse_router_metrics
from trtfleet.demand import prometheus_samples

TRITON_REQUESTS: Final = "nv_trt_llm_request_metrics"
TRITON_KV: Final = "nv_trt_llm_kv_cache_block_metrics"


@dataclass(frozen=True, slots=True)
class PodReading:
    requests: float | None = None
    """Running plus queued; None when the pod did not say."""
    kv_fraction: float | None = None


def parse_triton_metrics(text: str) -> PodReading:
    """A Triton pod's running + waiting requests and KV-cache fraction (summed / largest over models)."""
    requests: float | None = None
    kv: float | None = None
    for name, labels, value in prometheus_samples(text):
        if name == TRITON_REQUESTS and labels.get("request_type") in ("active", "waiting"):
            requests = (requests or 0.0) + value
        elif name == TRITON_KV and labels.get("kv_cache_block_type") == "fraction":
            kv = value if kv is None else max(kv, value)
    return PodReading(requests, kv)


def parse_trtllm_serve_stats(body: Any) -> PodReading:
    """trtllm-serve's ``/metrics`` JSON: the newest iteration stats entry (none: nothing to say)."""
    if not isinstance(body, list):
        raise MetricsParseError("trtllm-serve /metrics is a JSON list of iteration stats")
    if not body:
        return PodReading()
    newest = body[-1]
    if not isinstance(newest, dict):
        raise MetricsParseError("an iteration stats entry is a JSON object")
    active, queued = newest.get("numActiveRequests"), newest.get("numQueuedRequests")
    requests = None
    if isinstance(active, int | float) or isinstance(queued, int | float):
        requests = float(active or 0) + float(queued or 0)
    kv = None
    stats = newest.get("kvCacheStats")
    if isinstance(stats, dict) and isinstance(stats.get("maxNumBlocks"), int) and stats["maxNumBlocks"] > 0:
        kv = float(stats.get("usedNumBlocks") or 0) / stats["maxNumBlocks"]
    return PodReading(requests, kv)


def combine(routers: Sequence[RouterReading], pods: Sequence[PodReading], ready_pods: int) -> DemandSignals:
    """The base model's demand: router readings summed, pod readings summed (KV fraction averaged)."""
    pod_requests = [p.requests for p in pods if p.requests is not None]
    kv = [p.kv_fraction for p in pods if p.kv_fraction is not None]
    return DemandSignals(
        router_requests=sum(r.requests for r in routers),
        held_requests=sum(r.held for r in routers),
        pod_requests=sum(pod_requests),
        kv_cache_fraction=sum(kv) / len(kv) if kv else None,
        active_adapter_pages=sum(r.active_adapter_pages for r in routers) if routers else None,
        ready_pods=ready_pods,
    )
