"""Every Prometheus metric of the router, in one place (prefix ``trtfleet_router_``, base units).

Labels are bounded: ``frontend`` (openai, triton_http, triton_grpc), ``model_kind`` (base, adapter),
``code`` (``ok`` or an :class:`~trtfleet_router.errors.ErrorMapping` ``code_label``), ``pod`` (the
fleet's pods), ``reason`` (a fixed set). ``adapter`` appears only through :class:`AdapterLabels`, which
gives the first ``adapter_label_cap`` adapters their own label value and folds the rest into
``other``. A :class:`RouterMetrics` owns its own registry, so tests can build as many as they like.
"""

from __future__ import annotations

from typing import Final, Generic, TypeVar

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)

PREFIX: Final = "trtfleet_router_"
ADAPTER_LABEL_CAP_DEFAULT: Final = 50
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


class AdapterLabels:
    """Caps the cardinality of the ``adapter`` label: the first ``cap`` names seen, then ``other``."""

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

    def __init__(self, adapter_label_cap: int = ADAPTER_LABEL_CAP_DEFAULT) -> None:
        disable_created_metrics()  # type: ignore[no-untyped-call]  # no *_created series (process-wide)
        self.registry = r = CollectorRegistry(auto_describe=True)
        self.adapter_label = AdapterLabels(adapter_label_cap)

        def counter(name: str, doc: str, *labels: str) -> Labelled[Counter]:
            return Labelled(Counter(PREFIX + name, doc, labels, registry=r))

        def histogram(name: str, doc: str, *labels: str, buckets: tuple[float, ...]) -> Labelled[Histogram]:
            return Labelled(Histogram(PREFIX + name, doc, labels, buckets=buckets, registry=r))

        def gauge(name: str, doc: str, *labels: str) -> Labelled[Gauge]:
            return Labelled(Gauge(PREFIX + name, doc, labels, registry=r))

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
        self.weight_bytes_sent = Counter(
            PREFIX + "weight_bytes_sent", "Bytes of LoRA weights and configs sent to pods.", registry=r
        )
        self.inflight_requests = gauge("inflight_requests", "Upstream requests in flight per pod.", "pod")
        self.routing_decision = Histogram(
            PREFIX + "routing_decision_seconds",
            "Time the routing policy takes to pick a pod.",
            buckets=DECISION_BUCKETS_S,
            registry=r,
        )
        self.upstream_retries = counter(
            "upstream_retries",
            "Upstream attempts repeated, by reason (miss, cache_full, queue_full, pod_failed).",
            "reason",
        )
        self.upstream_attempts = counter(
            "upstream_attempts",
            "Attempts sent to pods, by transport (grpc_call, grpc_shared, http).",
            "transport",
        )
        self.weight_store_loads = counter(
            "weight_store_loads", "Adapter artifact loads into the weight store, by result.", "result"
        )
        self.weight_store_bytes = Gauge(
            PREFIX + "weight_store_bytes", "Bytes of adapter weights held in the weight store.", registry=r
        )
        self.pod_scrape_failures = Counter(
            PREFIX + "pod_scrape_failures", "Failed scrapes of a pod's Triton metrics endpoint.", registry=r
        )
        self.pods_ready = gauge("pods_ready", "Ready pods per base model.", "base_model")

    def exposition(self) -> bytes:
        """The registry in Prometheus' text format."""
        return generate_latest(self.registry)
