"""The router's demand metrics as both autoscalers read them (the operator's and ``trtfleet demo``'s).

Pure: Prometheus text in, one base model's numbers out. The names are the router's
(``router/trtfleet_router/metrics.py``): requests in the router (at a pod, waiting for LoRA capacity, or
held), held requests (no ready pod), the LoRA pages the adapters in flight need, and the load the base
model's pods report as the router scraped them (pods reporting, their running + queued requests, their mean
KV-cache fraction), each a gauge labelled ``base_model``; and per pod (label ``pod``) the demand its warm
adapters carry.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from prometheus_client.parser import text_string_to_metric_families

ROUTER_REQUESTS: Final = "trtfleet_router_base_model_requests"
ROUTER_HELD: Final = "trtfleet_router_held_requests"
ROUTER_ADAPTER_PAGES: Final = "trtfleet_router_active_adapter_pages"
ROUTER_PODS_REPORTING: Final = "trtfleet_router_pods_reporting_load"
ROUTER_POD_REQUESTS: Final = "trtfleet_router_pod_requests"
ROUTER_POD_KV: Final = "trtfleet_router_pod_kv_cache_used_ratio"
ROUTER_POD_WARM: Final = "trtfleet_router_pod_warm_demand"


class MetricsParseError(ValueError):
    """A scraped body is not the format its source speaks."""


@dataclass(frozen=True, slots=True)
class RouterReading:
    requests: float = 0.0
    held: float = 0.0
    active_adapter_pages: int = 0
    pods_reporting: int = 0
    """The base model's ready pods whose scraped load this replica holds fresh (each replica scrapes every pod)."""
    pod_requests: float = 0.0
    """Running + queued on those pods."""
    pod_kv_fraction: float | None = None
    """Their mean KV-cache fraction; None when none reports it."""
    pod_warm_demand: Mapping[str, float] = field(default_factory=dict)
    """Per pod name: the window's requests for the adapters warm on it (what removing it would cost)."""


def prometheus_samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    """(name, labels, value) of every sample in Prometheus' text format."""
    try:
        return [
            (sample.name, dict(sample.labels), float(sample.value))
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        ]
    except ValueError as exc:  # prometheus_client's parser raises ValueError on malformed text
        raise MetricsParseError(f"not Prometheus text: {exc}") from exc


def parse_router_metrics(text: str, base_model: str) -> RouterReading:
    """One router replica's demand for ``base_model`` and its pods' load (zeros when it has seen none)."""
    summed = (ROUTER_REQUESTS, ROUTER_HELD, ROUTER_ADAPTER_PAGES, ROUTER_PODS_REPORTING, ROUTER_POD_REQUESTS)
    values = dict.fromkeys(summed, 0.0)
    kv: float | None = None
    warm: dict[str, float] = {}
    for name, labels, value in prometheus_samples(text):
        if labels.get("base_model") != base_model or not math.isfinite(value):
            continue
        if name in values:
            values[name] += value
        elif name == ROUTER_POD_KV:
            kv = value
        elif name == ROUTER_POD_WARM and labels.get("pod"):
            warm[labels["pod"]] = warm.get(labels["pod"], 0.0) + value
    return RouterReading(
        values[ROUTER_REQUESTS],
        values[ROUTER_HELD],
        int(values[ROUTER_ADAPTER_PAGES]),
        int(values[ROUTER_PODS_REPORTING]),
        values[ROUTER_POD_REQUESTS],
        kv,
        warm,
    )
