"""Demand signals of a base model from the router replicas' metrics (pure: readings in, numbers out).

Sources, and what each one says (see docs/operations.md, "Autoscaling"): every router replica's Prometheus
``/metrics`` (:func:`trtfleet.demand.parse_router_metrics`), labelled ``base_model``:

* ``trtfleet_router_base_model_requests`` (in the router: at a pod, waiting for LoRA cache capacity, or
  held), ``trtfleet_router_held_requests`` (held for want of a ready pod) and
  ``trtfleet_router_active_adapter_pages`` (LoRA pages of the adapters active in the router's window). Each
  replica counts only its own requests, so the sums over replicas are exact; the active adapter pages are
  summed too, an upper bound when several replicas see the same adapter (it errs towards more pods);
* the pods' own load as the router scraped it (``trtfleet_router_pods_reporting_load``,
  ``trtfleet_router_pod_requests``, ``trtfleet_router_pod_kv_cache_used_ratio``). Every replica scrapes
  every pod, so these are not summed: the replica that holds fresh load for the most pods is taken.

The operator scrapes no serving pod itself: trtllm-serve's JSON ``/metrics`` hands each reader only the
iterations since the previous read, so a second reader would take entries from the router's.
"""

from __future__ import annotations

from collections.abc import Sequence

from trtfleet.autoscaling import DemandSignals
from trtfleet.demand import MetricsParseError as MetricsParseError
from trtfleet.demand import RouterReading as RouterReading
from trtfleet.demand import parse_router_metrics as parse_router_metrics


def combine(routers: Sequence[RouterReading], ready_pods: int) -> DemandSignals:
    """The base model's demand: router demand summed over replicas, the pods' load from the replica that
    has it for the most pods (ties: the larger request count)."""
    pods = max(routers, key=lambda r: (r.pods_reporting, r.pod_requests), default=RouterReading())
    return DemandSignals(
        router_requests=sum(r.requests for r in routers),
        held_requests=sum(r.held for r in routers),
        pod_requests=pods.pod_requests,
        kv_cache_fraction=pods.pod_kv_fraction,
        active_adapter_pages=sum(r.active_adapter_pages for r in routers) if routers else None,
        ready_pods=ready_pods,
    )
