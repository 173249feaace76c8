"""The demo's live summary: the router's ``/metrics`` and ``/debug/fleets``, read and condensed (pure).

    workers 2/2 ready · requests 12 ok, 0 failed · adapter hit rate 83% (10 warm, 2 loads, 0 misses)
      worker-1: tiny-upper, tiny-json        worker-2: tiny-reverse

"warm" is where the router's shadow of each worker's LoRA cache says an adapter is resident; a
request sent there carries only the task id. The hit rate is warm requests over all adapter requests.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from prometheus_client.parser import text_string_to_metric_families

from trtfleet.demo.processes import HTTP_PROBE_TIMEOUT_S

PREFIX: Final = "trtfleet_router_"


@dataclass(frozen=True)
class FleetSummary:
    workers_ready: int
    workers_total: int
    requests_ok: int
    requests_failed: int
    cache_hits: int
    adapter_loads: int
    cache_misses: int
    warm: Mapping[str, tuple[str, ...]]  # worker -> served names resident there

    @property
    def hit_rate(self) -> float | None:
        total = self.cache_hits + self.adapter_loads
        return None if total == 0 else self.cache_hits / total


def counter_totals(metrics_text: str) -> dict[str, float]:
    """Sum of every sample of each ``*_total`` counter of the router (labels folded), by sample name;
    ``trtfleet_router_requests_total`` is split into ``..._ok`` and ``..._failed`` by its ``code``."""
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if not sample.name.startswith(PREFIX) or not sample.name.endswith("_total"):
                continue
            name = sample.name
            if name == f"{PREFIX}requests_total":
                name += "_ok" if sample.labels.get("code") == "ok" else "_failed"
            totals[name] = totals.get(name, 0.0) + sample.value
    return totals


def warm_adapters(fleets: Mapping[str, Any], served_names: Mapping[int, str]) -> dict[str, tuple[str, ...]]:
    """Worker -> served names of the adapters resident in the router's shadow of its cache."""
    warm: dict[str, tuple[str, ...]] = {}
    for fleet in fleets.values():
        for pod in fleet.get("pods", []):
            ids = pod.get("resident_task_ids") or []
            warm[pod["pod_id"]] = tuple(served_names.get(i, f"task {i}") for i in sorted(ids))
    return warm


def summarize(
    metrics_text: str, fleets: Mapping[str, Any], served_names: Mapping[int, str], workers_ready: int,
    workers_total: int,
) -> FleetSummary:
    totals = counter_totals(metrics_text)

    def total(name: str) -> int:
        return int(totals.get(f"{PREFIX}{name}_total", 0))

    return FleetSummary(
        workers_ready=workers_ready,
        workers_total=workers_total,
        requests_ok=int(totals.get(f"{PREFIX}requests_total_ok", 0)),
        requests_failed=int(totals.get(f"{PREFIX}requests_total_failed", 0)),
        cache_hits=total("adapter_cache_hits"),
        adapter_loads=total("adapter_loads"),
        cache_misses=total("adapter_cache_misses"),
        warm=warm_adapters(fleets, served_names),
    )


def format_summary(summary: FleetSummary) -> str:
    rate = "n/a" if summary.hit_rate is None else f"{summary.hit_rate:.0%}"
    head = (
        f"workers {summary.workers_ready}/{summary.workers_total} ready · requests {summary.requests_ok} ok, "
        f"{summary.requests_failed} failed · adapter hit rate {rate} ({summary.cache_hits} warm, "
        f"{summary.adapter_loads} loads, {summary.cache_misses} misses)"
    )
    where = "    ".join(f"{worker}: {', '.join(names) or '-'}" for worker, names in sorted(summary.warm.items()))
    return f"{head}\n  warm: {where or '-'}"


def fetch_text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=HTTP_PROBE_TIMEOUT_S) as resp:
        return str(resp.read().decode("utf-8"))


def fetch_summary(
    metrics_base: str, served_names: Mapping[int, str], workers_ready: int, workers_total: int
) -> FleetSummary:
    """Read the router's metrics port (``http://host:port``); raises ``OSError`` when it does not answer."""
    metrics = fetch_text(f"{metrics_base}/metrics")
    fleets = json.loads(fetch_text(f"{metrics_base}/debug/fleets"))
    return summarize(metrics, fleets, served_names, workers_ready, workers_total)
