"""Load signals: scrape each pod's Triton metrics endpoint on an interval, feed ``fleet.observe_metrics``.

Read: ``nv_trt_llm_request_metrics{request_type="active"|"waiting"}`` and
``nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="fraction"}`` (summed over models). A pod
that does not answer within the timeout is skipped this round (its last values go stale in the fleet).
``kv_cache_block_type="reused"`` (cumulative reused KV blocks) corrects the fleet's prefix index, and ``"max"``
x ``"tokens_per"`` (the engine's KV-cache blocks and their size) sizes it (label names:
triton-inference-server/tensorrtllm_backend ``inflight_batcher_llm/src/custom_metrics_reporter/
custom_metrics_reporter.cc``@7f9aa46).

trtllm-serve pods (runtime pytorch) answer ``GET /metrics`` with JSON iteration stats instead (a list, the
iterations since the last call; ``tensorrt_llm/executor/iteration_stats.py``): the newest entry's
``numActiveRequests``, ``numQueuedRequests`` and ``kvCacheStats{usedNumBlocks, maxNumBlocks, tokensPerBlock,
reusedBlocks, missedBlocks}`` (:func:`parse_trtllm_serve_stats`). An empty list says the engine ran no iteration
since the last scrape: nothing ran or waited in it (an engine with a request iterates each step; trtfleet's pods
always set ``enable_iter_perf_stats``), so the pod reads as idle, 0 active and 0 waiting, its KV-cache use unknown.
Without that an idle pod's load would go stale and stay so until it served again, and a detector that fails closed
on stale pods (llm-d's utilization detector) would never let a request reach it.

Speculative decoding and bandwidth (:mod:`.acceptance`): each pod's drafted / accepted tokens and iterations
become its acceptance rate, tokens per step (which the routing step model divides the in-flight delay by,
``PodMetrics.tokens_per_step``), decode steps per second and model bandwidth utilisation (with the base model's
weight and KV bytes and peak bandwidth from ``status.capacity``), exported per pod and per adapter.

Each round also exports the ready pods' scraped load per base model (``trtfleet_router_pods_reporting_load``,
``trtfleet_router_pod_requests``, ``trtfleet_router_pod_kv_cache_used_ratio``): the operator's autoscaler reads
the pods through these and scrapes no pod itself, because trtllm-serve's JSON ``/metrics`` hands each reader
only the iterations since the previous read (``get_iteration_stats`` drains ``get_stats_async``), so every
extra reader takes entries from the others.

Restarts in place: ``nv_inference_request_success`` + ``nv_inference_request_failure`` (summed over
models) count requests since Triton started (triton-inference-server/server
``docs/user_guide/metrics.md``). A sum lower than the last one scraped from the same pod means its
Triton restarted inside the pod (same uid and address, empty LoRA cache), even when no readiness
probe saw it down: ``Fleet.reset_pod`` empties its shadow and tells the other router replicas. A
restart followed by more requests than before within one scrape interval goes unseen here (misses
then correct the view).
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
from dataclasses import dataclass
from typing import Final

import aiohttp

from trtfleet_router import jsoncodec
from trtfleet_router.liveview import FleetSet
from trtfleet_router.metrics import RouterMetrics, SpeculationScrape
from trtfleet_router.routing.types import PodMetrics
from trtfleet_router.upstream.acceptance import (
    PodSpeculation,
    SpecSample,
    TritonSpecLines,
    iterations_from_trtllm_serve,
    spec_from_trtllm_serve,
)

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
    reused_blocks: int | None = None  # kv_cache_block_type="reused": cumulative KV blocks reused (prefix index)
    missed_blocks: int | None = None  # trtllm-serve kvCacheStats.missedBlocks (Triton has none)
    requests_total: int | None = None  # requests Triton handled since it started (all models)
    kv_max_blocks: int | None = None  # the engine's KV-cache size in its own blocks (Triton "max")
    kv_tokens_per_block: int | None = None  # its block size (Triton "tokens_per")
    spec: SpecSample | None = None  # speculative decoding counts (acceptance.py); None: the pod does not speculate
    iterations: int | None = None  # engine iterations since it started
    idle: bool = False  # trtllm-serve ran no iteration since the last scrape (0 active, 0 waiting)

    def kv_tokens_in_use(self) -> int | None:
        """KV-cache tokens the running requests hold (what each step reads), where the pod says it."""
        if self.kv_fraction is None or not self.kv_max_blocks or not self.kv_tokens_per_block:
            return None
        return round(self.kv_fraction * self.kv_max_blocks * self.kv_tokens_per_block)

    def kv_capacity_blocks(self, router_block_tokens: int) -> int | None:
        """The engine's KV-cache size in blocks of ``router_block_tokens`` (the prefix index's block); None when
        the pod does not export it. A pod that exports no block size is taken to use the router's."""
        if not self.kv_max_blocks or router_block_tokens < 1:
            return None
        return self.kv_max_blocks * (self.kv_tokens_per_block or router_block_tokens) // router_block_tokens


def parse_triton_metrics(text: str) -> ScrapedLoad:
    """The three load signals from Triton's Prometheus text (pure)."""
    active = waiting = requests = None
    kv = None
    reused: int | None = None
    kv_max = tokens_per = None
    spec = TritonSpecLines()
    for line in text.splitlines():
        if not line.startswith(("nv_trt_llm_request", "nv_trt_llm_kv", "nv_inference_request_",
                                "nv_trt_llm_general", "trtfleet_reference_spec_decode")):
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
        elif match["name"] == KV_METRIC and labels.get("kv_cache_block_type") == "reused":
            reused = (reused or 0) + int(value)
        elif match["name"] == KV_METRIC and labels.get("kv_cache_block_type") == "max":
            kv_max = int(value) if kv_max is None else max(kv_max, int(value))  # one engine's pool, not a sum
        elif match["name"] == KV_METRIC and labels.get("kv_cache_block_type") == "tokens_per":
            tokens_per = int(value)
        elif match["name"] in REQUEST_COUNTERS:
            requests = (requests or 0) + int(value)
        else:
            spec.feed(match["name"], labels, value)
    return ScrapedLoad(active, waiting, kv, reused, requests_total=requests, kv_max_blocks=kv_max,
                       kv_tokens_per_block=tokens_per, spec=spec.sample(), iterations=spec.iterations)


def _count(value: object) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def parse_trtllm_serve_stats(payload: object) -> ScrapedLoad:
    """The load signals from trtllm-serve's JSON ``/metrics`` (pure); an idle pod (0 active, 0 waiting) when it holds
    no iteration, all None when it is not a list of iterations."""
    if isinstance(payload, list) and not payload:
        return ScrapedLoad(0, 0, None, idle=True)
    if not isinstance(payload, list) or not isinstance(payload[-1], dict):
        return ScrapedLoad(None, None, None)
    last = payload[-1]
    kv = last.get("kvCacheStats")
    kv = kv if isinstance(kv, dict) else {}
    used, total = _count(kv.get("usedNumBlocks")), _count(kv.get("maxNumBlocks"))
    fraction = used / total if used is not None and total else None
    entries = [entry for entry in payload if isinstance(entry, dict)]
    return ScrapedLoad(_count(last.get("numActiveRequests")), _count(last.get("numQueuedRequests")), fraction,
                       _count(kv.get("reusedBlocks")), _count(kv.get("missedBlocks")), kv_max_blocks=total,
                       kv_tokens_per_block=_count(kv.get("tokensPerBlock")), spec=spec_from_trtllm_serve(entries),
                       iterations=iterations_from_trtllm_serve(entries))


def parse_pod_metrics(body: bytes) -> ScrapedLoad:
    """Triton's Prometheus text or trtllm-serve's JSON stats, told apart by the first character."""
    text = body.decode("utf-8", errors="replace")
    if text.lstrip().startswith("["):
        try:
            return parse_trtllm_serve_stats(jsoncodec.loads(body))
        except ValueError:
            return ScrapedLoad(None, None, None)
    return parse_triton_metrics(text)


def restarted(previous_requests: int | None, requests: int | None) -> bool:
    """Triton's request counters went back: the server restarted between the two scrapes."""
    return previous_requests is not None and requests is not None and requests < previous_requests


class MetricsScraper:
    def __init__(self, fleets: FleetSet, metrics: RouterMetrics, interval_s: float = SCRAPE_INTERVAL_S_DEFAULT):
        self.fleets = fleets
        self.metrics = metrics
        self.interval_s = interval_s
        self._requests: dict[tuple[str, str, str], int] = {}  # (base, pod, uid) -> requests_total last scraped
        self._speculation: dict[tuple[str, str, str], PodSpeculation] = {}  # (base, pod, uid) -> its figures

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
                for gone in [key for key in self._speculation if key not in seen]:
                    del self._speculation[gone]
                    self.metrics.forget_pod_speculation(gone[0], gone[1])
                for (base, endpoint), result in zip(targets, results, strict=True):
                    if isinstance(result, BaseException):
                        self.metrics.pod_scrape_failures.inc()
                        log.debug("scrape failed", extra={"ctx": {"pod": endpoint.pod_id, "error": str(result)}})
                        continue
                    self._check_restart(base, endpoint.pod_id, endpoint.uid, result.requests_total)
                    tokens_per_step = self._observe_speculation(base, endpoint.pod_id, endpoint.uid, result)
                    if result.active is None and result.waiting is None:
                        continue
                    fleet = self.fleets.fleets.get(base)
                    entry = self.fleets.registry.bases.get(base)
                    if fleet is not None:
                        capacity = result.kv_capacity_blocks(entry.kv_tokens_per_block) if entry else None
                        fleet.observe_metrics(
                            endpoint.pod_id,
                            PodMetrics(result.active or 0, result.waiting or 0, result.kv_fraction,
                                       result.reused_blocks, result.missed_blocks, capacity, tokens_per_step),
                        )
                for base in self.fleets.registry.bases:
                    self.metrics.pods_ready.labels(base).set(len(self.fleets.ready_endpoints(base)))
                    self._export_pod_load(base)
                await asyncio.sleep(self.interval_s)

    def _observe_speculation(self, base: str, pod: str, uid: str, result: ScrapedLoad) -> float | None:
        """Fold the pod's speculation counters and iterations in, export them; its tokens per step (None: it does
        not speculate, or has not drafted yet)."""
        state = self._speculation.setdefault((base, pod, uid), PodSpeculation())
        drafted, accepted = state.observe(result.spec, result.iterations, asyncio.get_running_loop().time())
        entry = self.fleets.registry.bases.get(base)
        mbu = None
        if entry is not None:
            mbu = state.bandwidth_utilization(entry.weights_bytes, entry.kv_bytes_per_token,
                                              result.kv_tokens_in_use(), entry.memory_bandwidth_bytes_per_s)
        adapters = {a.task_id: a.served_name for a in self.fleets.registry.adapters_of(base)} if entry else {}
        current = state.current
        self.metrics.observe_pod_speculation(base, pod, SpeculationScrape(
            drafted,
            accepted,
            current.acceptance_rate if current is not None else None,
            current.tokens_per_step if current is not None else None,
            state.steps_per_s,
            mbu,
            {"base" if task == 0 else adapters.get(task, f"task-{task}"): found.acceptance_rate
             for task, found in state.by_adapter.items()},
        ))
        if (result.spec is None and not result.idle) or current is None or math.isnan(current.tokens_per_step):
            return None  # an idle pod keeps the tokens per step it last drafted at
        return current.tokens_per_step

    def _export_pod_load(self, base: str) -> None:
        """The base model's pods' load as scraped, for the operator (which never scrapes pods itself)."""
        fleet = self.fleets.fleets.get(base)
        if fleet is None:
            return
        load = fleet.pod_load()
        kv = load.kv_cache_used_fraction
        self.metrics.pods_reporting_load.labels(base).set(load.pods_reporting)
        self.metrics.pod_requests.labels(base).set(load.requests)
        self.metrics.pod_kv_cache_used_ratio.labels(base).set(math.nan if kv is None else kv)

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
            return parse_pod_metrics(await response.read())
