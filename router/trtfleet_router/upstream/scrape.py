"""Load signals: scrape each pod's Triton metrics endpoint on an interval, feed ``fleet.observe_metrics``.

Read: ``nv_trt_llm_request_metrics{request_type="active"|"waiting"}`` and
``nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="fraction"}`` (summed over models). A pod
that does not answer within the timeout is skipped this round (its last values go stale in the fleet).

Restarts in place: ``nv_inference_request_success`` + ``nv_inference_request_failure`` (summed over
models) count requests since Triton started (triton-inference-server/server
``docs/user_guide/metrics.md``). A sum lower than the last one scraped from the same pod means its
Triton restarted inside the pod (same uid and address, empty LoRA cache), even when no readiness
probe saw it down: ``Fleet.reset_pod`` empties its shadow and tells the other router replicas. A
restart followed by more requests than before within one scrape interval goes unseen here (misses
then correct the view, as before).
"""

from __future__ import annotations

import asyncio
import logging
import re
from dataclasses import dataclass
from typing import Final

import aiohttp

from trtfleet_router.fleets import FleetSet
from trtfleet_router.metrics import RouterMetrics
from trtfleet_router.routing.types import PodMetrics

log = logging.getLogger(__name__)

SCRAPE_INTERVAL_S_DEFAULT: Final = 1.0
SCRAPE_TIMEOUT_S: Final = 0.8
REQUEST_METRIC: Final = "nv_trt_llm_request_metrics"
KV_METRIC: Final = "nv_trt_llm_kv_cache_block_metrics"
REQUEST_COUNTERS: Final = ("nv_inference_request_success", "nv_inference_request_failure")
_LINE: Final = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)\{(?P<labels>[^}]*)\}\s+(?P<value>\S+)")
_LABEL: Final = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True, slots=True)
class ScrapedLoad:
    active: int | None
    waiting: int | None
    kv_fraction: float | None
    requests_total: int | None = None  # requests Triton handled since it started (all models)


def parse_triton_metrics(text: str) -> ScrapedLoad:
    """The three load signals from Triton's Prometheus text (pure)."""
    active = waiting = requests = None
    kv = None
    for line in text.splitlines():
        if not line.startswith(("nv_trt_llm_request", "nv_trt_llm_kv", "nv_inference_request_")):
            continue
        match = _LINE.match(line)
        if match is None:
            continue
        labels = dict(_LABEL.findall(match["labels"]))
        try:
            value = float(match["value"])
        except ValueError:
            continue
        if match["name"] == REQUEST_METRIC:
            kind = labels.get("request_type")
            if kind == "active":
                active = (active or 0) + int(value)
            elif kind == "waiting":
                waiting = (waiting or 0) + int(value)
        elif match["name"] == KV_METRIC and labels.get("kv_cache_block_type") == "fraction":
            kv = value if kv is None else max(kv, value)
        elif match["name"] in REQUEST_COUNTERS:
            requests = (requests or 0) + int(value)
    return ScrapedLoad(active, waiting, kv, requests)


def restarted(previous_requests: int | None, requests: int | None) -> bool:
    """Triton's request counters went back: the server restarted between the two scrapes."""
    return previous_requests is not None and requests is not None and requests < previous_requests


class MetricsScraper:
    def __init__(self, fleets: FleetSet, metrics: RouterMetrics, interval_s: float = SCRAPE_INTERVAL_S_DEFAULT):
        self.fleets = fleets
        self.metrics = metrics
        self.interval_s = interval_s
        self._requests: dict[tuple[str, str, str], int] = {}  # (base, pod, uid) -> requests_total last scraped

    async def run(self) -> None:
        timeout = aiohttp.ClientTimeout(total=SCRAPE_TIMEOUT_S)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while True:
                targets = [(base, ep) for base, ep in self.fleets.all_endpoints() if ep.metrics_url]
                results = await asyncio.gather(
                    *(self._scrape(session, ep.metrics_url or "") for _, ep in targets),
                    return_exceptions=True,
                )
                seen = {(base, ep.pod_id, ep.uid) for base, ep in targets}
                self._requests = {key: n for key, n in self._requests.items() if key in seen}
                for (base, endpoint), result in zip(targets, results, strict=True):
                    if isinstance(result, BaseException):
                        self.metrics.pod_scrape_failures.inc()
                        log.debug("scrape failed", extra={"ctx": {"pod": endpoint.pod_id, "error": str(result)}})
                        continue
                    self._check_restart(base, endpoint.pod_id, endpoint.uid, result.requests_total)
                    if result.active is None and result.waiting is None:
                        continue
                    fleet = self.fleets.fleets.get(base)
                    if fleet is not None:
                        fleet.observe_metrics(
                            endpoint.pod_id,
                            PodMetrics(result.active or 0, result.waiting or 0, result.kv_fraction),
                        )
                for base in self.fleets.registry.bases:
                    self.metrics.pods_ready.labels(base).set(len(self.fleets.ready_endpoints(base)))
                await asyncio.sleep(self.interval_s)

    def _check_restart(self, base: str, pod_id: str, uid: str, requests: int | None) -> None:
        key = (base, pod_id, uid)
        fleet = self.fleets.fleets.get(base)
        if fleet is not None and restarted(self._requests.get(key), requests):
            fleet.reset_pod(pod_id, "request counters went back")
        if requests is not None:
            self._requests[key] = requests

    @staticmethod
    async def _scrape(session: aiohttp.ClientSession, url: str) -> ScrapedLoad:
        async with session.get(url) as response:
            response.raise_for_status()
            return parse_triton_metrics(await response.text())
