"""Every Prometheus metric of the router, in one place (prefix ``trtfleet_router_``, base units).

Labels are bounded: ``frontend`` (openai, triton_http, triton_grpc), ``model_kind`` (base, adapter),
``code`` (``ok`` or an :class:`~trtfleet_router.errors.ErrorMapping` ``code_label``), ``pod`` (the
fleet's pods), ``reason`` (a fixed set), ``band`` (the four priority bands). ``adapter`` and ``tenant`` appear only
through :class:`CappedLabels`, which gives the first ``adapter_label_cap`` names of each its own label value and
folds the rest into ``other``. ``base_model`` is bounded by the registry. A :class:`RouterMetrics` owns its own
registry, so tests can build as many as they like.

The metrics updated on every request are :class:`LoopCounter`, :class:`LoopGauge` and
:class:`LoopHistogram`: plain numbers without ``prometheus_client``'s per-update lock and checks
(about 1 us per update, over a dozen updates per request), read by a collector at scrape time. They
must only be updated and read on the event loop's thread (request handlers, the gRPC server's
handlers and the ``/metrics`` handler all run there; nothing in a worker thread may touch them).
Metrics off the per-request path (weight store loads and bytes, scrape failures) stay plain
``prometheus_client`` objects, which are safe from any thread.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Final, Generic, TypeVar

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, Metric

from trtfleet_router.activity import AdapterActivity
from trtfleet_router.loopmetrics import LAG_BUCKETS_S, LoopCollector, LoopCounter, LoopGauge, LoopHistogram

PREFIX: Final = "trtfleet_router_"


@dataclass(frozen=True, slots=True)
class SpeculationScrape:
    """What one scrape of a pod says about its speculation and bandwidth use (see ``upstream/acceptance.py``)."""

    drafted: int = 0  # draft tokens since the last scrape
    accepted: int = 0
    acceptance_rate: float | None = None
    tokens_per_step: float | None = None
    steps_per_s: float | None = None
    mbu: float | None = None
    adapter_acceptance: Mapping[str, float] = field(default_factory=dict)  # served name ("base": none) -> rate
ADAPTER_LABEL_CAP_DEFAULT: Final = 50
ACTIVE_ADAPTER_WINDOW_S_DEFAULT: Final = 60.0
OTHER_ADAPTERS: Final = "other"
NO_ADAPTER: Final = ""

LATENCY_BUCKETS_S: Final = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)
DECISION_BUCKETS_S: Final = (0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.01)


M = TypeVar("M", Counter, Gauge, Histogram)
LM = TypeVar("LM", LoopCounter, LoopGauge, LoopHistogram)


class Labelled(Generic[M]):
    """A labelled metric whose children are looked up once (``labels()`` costs microseconds)."""

    __slots__ = ("_children", "metric")
    metric: M

    def __init__(self, metric: M) -> None:
        self.metric = metric
        self._children: dict[tuple[str, ...], M] = {}

    def labels(self, *values: str) -> M:
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = self.metric.labels(*values)
        return child


class CappedLabels:
    """Caps the cardinality of a label (``adapter``, ``tenant``): the first ``cap`` names seen, then ``other``."""

    def __init__(self, cap: int = ADAPTER_LABEL_CAP_DEFAULT) -> None:
        self.cap = cap
        self._known: set[str] = set()

    def __call__(self, adapter: str | None) -> str:
        if not adapter:
            return NO_ADAPTER
        if adapter in self._known:
            return adapter
        if len(self._known) < self.cap:
            self._known.add(adapter)
            return adapter
        return OTHER_ADAPTERS


class RouterMetrics:
    """The router's metrics, registered in ``self.registry``."""

    def __init__(
        self,
        adapter_label_cap: int = ADAPTER_LABEL_CAP_DEFAULT,
        active_adapter_window_s: float = ACTIVE_ADAPTER_WINDOW_S_DEFAULT,
    ) -> None:
        disable_created_metrics()  # type: ignore[no-untyped-call]  # no *_created series (process-wide)
        self.registry = r = CollectorRegistry(auto_describe=True)
        self.adapter_label = CappedLabels(adapter_label_cap)
        self.tenant_label = CappedLabels(adapter_label_cap)

        loop_metrics = LoopCollector()

        def loop_metric(metric: LM) -> LM:
            loop_metrics.metrics.append(metric)
            return metric

        def counter(name: str, doc: str, *labels: str) -> LoopCounter:
            return loop_metric(LoopCounter(PREFIX + name, doc, labels))

        def histogram(name: str, doc: str, *labels: str, buckets: tuple[float, ...]) -> LoopHistogram:
            return loop_metric(LoopHistogram(PREFIX + name, doc, labels, buckets))

        def gauge(name: str, doc: str, *labels: str) -> LoopGauge:
            return loop_metric(LoopGauge(PREFIX + name, doc, labels))

        def thread_counter(name: str, doc: str, *labels: str) -> Labelled[Counter]:
            return Labelled(Counter(PREFIX + name, doc, labels, registry=r))

        f, k = "frontend", "model_kind"
        self.requests = counter("requests", "Client requests by front end, model kind and outcome code.", f, k, "code")
        self.time_to_first_token = histogram(
            "time_to_first_token_seconds",
            "Time from request arrival to the first output sent to the client.",
            f,
            k,
            buckets=LATENCY_BUCKETS_S,
        )
        self.inter_token_latency = histogram(
            "inter_token_latency_seconds", "Time between consecutive streamed outputs.", k, buckets=LATENCY_BUCKETS_S
        )
        self.request_duration = histogram(
            "request_duration_seconds",
            "Time from request arrival to the last byte of the answer.",
            f,
            k,
            buckets=LATENCY_BUCKETS_S,
        )
        self.input_tokens = counter("input_tokens", "Prompt tokens (engine count, else estimated).", k)
        self.output_tokens = counter("output_tokens", "Generated tokens (engine count, else estimated).", k)
        self.adapter_cache_hits = counter(
            "adapter_cache_hits", "Requests sent id-only to a pod that held the adapter.", "adapter"
        )
        self.adapter_cache_misses = counter(
            "adapter_cache_misses", "Requests a pod answered with 'LoRA task N not found in cache'.", "adapter"
        )
        self.adapter_loads = counter("adapter_loads", "Requests that carried an adapter's weights to a pod.", "adapter")
        self.weight_bytes_sent = counter("weight_bytes_sent", "Bytes of LoRA weights and configs sent to pods.")
        self.inflight_requests = gauge("inflight_requests", "Upstream requests in flight per pod.", "pod")
        self.routing_decision = histogram(
            "routing_decision_seconds", "Time the routing policy takes to pick a pod.", buckets=DECISION_BUCKETS_S
        )
        self.event_loop_lag = histogram(
            "event_loop_lag_seconds",
            "How much later than due the event loop ran a timer, sampled every 20 ms (loopmetrics.py).",
            buckets=LAG_BUCKETS_S,
        )
        self.upstream_retries = counter(
            "upstream_retries",
            "Upstream attempts repeated, by reason (miss, cache_full, queue_full, pod_failed, stalled).",
            "reason",
        )
        self.upstream_attempts = counter(
            "upstream_attempts",
            "Attempts sent to pods, by transport (grpc_call, grpc_shared, http, openai).",
            "transport",
        )
        self.weight_store_loads = thread_counter(
            "weight_store_loads", "Adapter artifact loads into the weight store, by result.", "result"
        )
        self.weight_store_bytes = Gauge(
            PREFIX + "weight_store_bytes", "Bytes of adapter weights held in the weight store.", registry=r
        )
        self.pod_scrape_failures = Counter(
            PREFIX + "pod_scrape_failures", "Failed scrapes of a pod's Triton metrics endpoint.", registry=r
        )
        # tenancy: where requests wait, by band and tenant (capped label), what they were served, what was shed
        self.queue_waiting = gauge(
            "queue_waiting_requests",
            "Requests waiting in the router now (for capacity or a ready pod), per base model and priority band.",
            "base_model",
            "band",
        )
        self.queue_wait = histogram(
            "queue_wait_seconds",
            "Time a request waited in the router before it started (0 for one that never waited), by base model, "
            "band and tenant.",
            "base_model",
            "band",
            "tenant",
            buckets=LATENCY_BUCKETS_S,
        )
        self.tenant_tokens = counter(
            "tenant_served_tokens",
            "Tokens served per tenant: kind input (prompt, when the request starts) or output (as it streams).",
            "base_model",
            "tenant",
            "kind",
        )
        self.shed_requests = counter(
            "shed_requests",
            "Requests turned away or pushed out of the line while the fleet was saturated, by band, tenant and "
            "reason (tenant_over_share, priority_shed, saturated).",
            "base_model",
            "band",
            "tenant",
            "reason",
        )
        self.pods_ready = gauge("pods_ready", "Ready pods per base model.", "base_model")
        self.capacity_waiting = gauge(
            "capacity_waiting_requests",
            "Requests waiting for capacity: a saturated fleet (tenancy.saturation) or every pod's LoRA cache full of "
            "busy adapters.",
            "base_model",
        )
        self.capacity_waits = counter(
            "capacity_waits",
            "Ends of a wait for capacity: routed, timed_out, queue_full (turned away at once); "
            "batch_bound (a batch line that waited for headroom its whole capacityWaitS and went anyway).",
            "base_model",
            "result",
        )
        self.pod_failures = counter(
            "pod_failures",
            "Failures held against a pod for outlier detection, by reason (pod_failed, stalled, probe).",
            "pod",
            "reason",
        )
        self.pod_ejections = counter("pod_ejections", "Pods ejected by outlier detection.", "pod")
        self.pods_ejected = gauge("pods_ejected", "Pods ejected now, per base model.", "base_model")
        # demand per base model, what the operator's autoscaler sums over router replicas
        self.base_model_requests = gauge(
            "base_model_requests",
            "Client requests of a base model in this router now: at a pod, waiting for LoRA cache capacity or "
            "held for want of a ready pod.",
            "base_model",
        )
        self.held_requests = gauge(
            "held_requests", "Requests held while the base model has no ready pod (scale from zero).", "base_model"
        )
        self.holds = counter(
            "holds",
            "Ends of a hold for want of a ready pod: released (a pod became ready), timed_out, queue_full.",
            "base_model",
            "result",
        )
        self.adapter_requests = counter(
            "adapter_requests", "Client requests per adapter (capped label, see the module docstring).", "base_model",
            "adapter",
        )
        self.activity = AdapterActivity(active_adapter_window_s)
        self.pod_warm_demand: Callable[[], Iterable[tuple[str, str, int]]] | None = None
        """``(base model, pod, warm demand)`` per pod, set by the router (it knows the pods' warm sets)."""
        loop_metrics.extra.append(self._active_adapter_families)
        self.batch_reserved_pods: Callable[[], Iterable[tuple[str, int]]] | None = None
        """``(base model, pods reserved now)``, set by the batch wiring when ``--batch-reserve-pods`` is on."""
        loop_metrics.extra.append(self._batch_reserve_families)
        self.peers_connected = gauge("peers_connected", "Other router replicas whose event stream is up.")
        self.peer_events = counter(
            "peer_events", "Other replicas' residency events received: applied, ignored (unknown pod).", "result"
        )
        self.peer_stream_gaps = counter(
            "peer_stream_gaps", "Reconnects to a peer whose event ring no longer held the events missed."
        )
        # the pods' own load as this replica scraped it: the operator reads pods only through the routers
        self.pods_reporting_load = gauge("pods_reporting_load", "Ready pods with fresh scraped load.", "base_model")
        self.pod_requests = gauge("pod_requests", "Running + queued requests the pods report, summed.", "base_model")
        self.pod_kv_cache_used_ratio = gauge(
            "pod_kv_cache_used_ratio", "Mean KV-cache fraction the pods report (NaN: none does).", "base_model"
        )
        self.fleet_inflight_requests = gauge(
            "fleet_inflight_requests", "Requests in flight per base model, every router replica's.", "base_model"
        )
        # speculative decoding and bandwidth use, as the pods report them (upstream/acceptance.py)
        self.spec_draft_tokens = counter(
            "spec_decode_draft_tokens", "Draft tokens the pods verified (their trtllm_spec_decode counters).",
            "base_model")
        self.spec_accepted_tokens = counter(
            "spec_decode_accepted_tokens", "Draft tokens the pods accepted.", "base_model")
        self.pod_spec_acceptance = gauge(
            "pod_spec_decode_acceptance_ratio",
            "Accepted / drafted tokens over the pod's last scrape interval that drafted.", "base_model", "pod")
        self.pod_tokens_per_step = gauge(
            "pod_spec_decode_tokens_per_step",
            "Tokens a step gave a request that drafted (1 + accepted drafts), last interval that drafted.",
            "base_model", "pod")
        self.base_model_tokens_per_step = gauge(
            "base_model_spec_decode_tokens_per_step",
            "Mean tokens per step over the base model's pods that drafted.", "base_model")
        self.pod_decode_steps_per_second = gauge(
            "pod_decode_steps_per_second", "Engine iterations per second over the last scrape interval.",
            "base_model", "pod")
        self.pod_bandwidth_utilization = gauge(
            "pod_model_bandwidth_utilization_ratio",
            "MBU: (weight bytes + KV bytes in use) x steps per second / the GPU's peak memory bandwidth.",
            "base_model", "pod")
        self.adapter_spec_acceptance = gauge(
            "adapter_spec_decode_acceptance_ratio",
            "Accepted / drafted tokens per adapter where the pods say it (capped adapter label; base: no adapter).",
            "base_model", "adapter")
        self._speculating: dict[str, dict[str, float]] = {}
        r.register(loop_metrics)

    def observe_pod_speculation(self, base: str, pod: str, scrape: SpeculationScrape) -> None:
        """One pod's scrape: its acceptance, tokens per step, steps per second and MBU (upstream/scrape.py)."""
        if scrape.drafted:
            self.spec_draft_tokens.labels(base).inc(scrape.drafted)
        if scrape.accepted:
            self.spec_accepted_tokens.labels(base).inc(scrape.accepted)
        if scrape.acceptance_rate is not None:
            self.pod_spec_acceptance.labels(base, pod).set(scrape.acceptance_rate)
        if scrape.tokens_per_step is not None and not math.isnan(scrape.tokens_per_step):
            self.pod_tokens_per_step.labels(base, pod).set(scrape.tokens_per_step)
            self._speculating.setdefault(base, {})[pod] = scrape.tokens_per_step
            values = self._speculating[base].values()
            self.base_model_tokens_per_step.labels(base).set(sum(values) / len(values))
        if scrape.steps_per_s is not None:
            self.pod_decode_steps_per_second.labels(base, pod).set(scrape.steps_per_s)
        if scrape.mbu is not None:
            self.pod_bandwidth_utilization.labels(base, pod).set(scrape.mbu)
        for name, acceptance_rate in scrape.adapter_acceptance.items():
            self.adapter_spec_acceptance.labels(base, self.adapter_label(name)).set(acceptance_rate)

    def forget_pod_speculation(self, base: str, pod: str) -> None:
        """A pod is gone: its series go with it."""
        for gauge in (self.pod_spec_acceptance, self.pod_tokens_per_step, self.pod_decode_steps_per_second,
                      self.pod_bandwidth_utilization):
            gauge.remove(base, pod)
        pods = self._speculating.get(base, {})
        pods.pop(pod, None)
        if pods:
            self.base_model_tokens_per_step.labels(base).set(sum(pods.values()) / len(pods))
        else:
            self.base_model_tokens_per_step.remove(base)

    def _active_adapter_families(self) -> Iterator[Metric]:
        count = GaugeMetricFamily(
            PREFIX + "active_adapters",
            "Distinct adapters with requests in the activity window, per base model.",
            labels=("base_model",),
        )
        pages = GaugeMetricFamily(
            PREFIX + "active_adapter_pages",
            "LoRA cache pages (host-tier geometry) the adapters in flight need, weighted by their share of the "
            "window's requests, per base model.",
            labels=("base_model",),
        )
        for base in self.activity.base_models():
            active = self.activity.active(base)
            count.add_metric((base,), active.count)
            pages.add_metric((base,), active.pages)
        yield count
        yield pages
        if self.pod_warm_demand is not None:
            warm = GaugeMetricFamily(
                PREFIX + "pod_warm_demand",
                "Requests in the activity window for the adapters warm on each pod (what removing it would "
                "cost in cold loads), per base model and pod.",
                labels=("base_model", "pod"),
            )
            for base, pod, demand in self.pod_warm_demand():
                warm.add_metric((base, pod), demand)
            yield warm

    def _batch_reserve_families(self) -> Iterator[Metric]:
        if self.batch_reserved_pods is None:
            return
        reserved = GaugeMetricFamily(
            PREFIX + "batch_reserved_pods",
            "Ready pods the batch reserve keeps free of new batch lines now (0 while no interactive request "
            "comes), per base model.",
            labels=("base_model",),
        )
        for base, count in self.batch_reserved_pods():
            reserved.add_metric((base,), count)
        yield reserved

    def exposition(self) -> bytes:
        """The registry in Prometheus' text format."""
        return generate_latest(self.registry)
