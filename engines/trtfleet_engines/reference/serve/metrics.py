"""``/prometheus/metrics`` of the reference ``pytorch`` mode: trtllm-serve's ``trtllm_`` names, plus LoRA cache
counters under ``trtfleet_reference_`` (upstream exposes no adapter residency; these exist so tests and
benchmarks can see the tiers) and the prefill positions computed vs. started
(``trtfleet_reference_prefill_tokens_computed_total`` / ``..._prefill_prompt_tokens_total``: their difference is
the work KV-cache block reuse skipped).

With speculation: ``trtllm_spec_decode_num_draft_tokens_total``, ``trtllm_spec_decode_num_accepted_tokens_total``,
``trtllm_spec_decode_acceptance_length`` and ``trtllm_avg_decoded_tokens_per_iter`` as upstream names them
(``tensorrt_llm/metrics/collector.py``@050f80de), and per LoRA id, which upstream does not say,
``trtfleet_reference_spec_decode_adapter_{draft,accepted}_tokens_total{lora_id}`` (at most
:data:`~trtfleet_engines.reference.metrics.ADAPTER_SERIES_CAP` ids).

Upstream (``tensorrt_llm/metrics/collector.py``, created in ``openai_server.py`` with the labels
``{"model_name": "undefined", "engine_type": "undefined"}``) mounts this only when ``return_perf_metrics`` is
set; so does the reference server. All metrics of the component are defined here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from trtfleet_engines.reference.metrics import adapter_values
from trtfleet_engines.reference.scheduler import BatcherStats

LABELS = {"model_name": "undefined", "engine_type": "undefined"}
LATENCY_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class _EngineCollector(Collector):
    """Gauges read at scrape time from the batcher and the LoRA store."""

    def __init__(self, stats: Callable[[], BatcherStats], lora: Callable[[], dict[str, Any] | None]) -> None:
        self._stats = stats
        self._lora = lora

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        stats = self._stats()
        names = list(LABELS)
        values = list(LABELS.values())
        for name, text, value in (
            ("trtllm_num_requests_running", "Requests in the active batch.", stats.active_requests),
            ("trtllm_num_requests_waiting", "Requests queued for the batch.", stats.waiting_requests),
            ("trtllm_kv_cache_utilization", "Used share of the KV-cache blocks.",
             stats.kv_used_blocks / stats.kv_max_blocks if stats.kv_max_blocks else 0.0),
            ("trtllm_kv_cache_hit_rate", "Reused / (reused + missed) KV-cache blocks since start.",
             stats.kv_cache_hit_rate),
        ):
            gauge = GaugeMetricFamily(name, text, labels=names)
            gauge.add_metric(values, value)
            yield gauge
        decoded = GaugeMetricFamily("trtllm_avg_decoded_tokens_per_iter",
                                    "Tokens per generation request in the last iteration.", labels=names)
        decoded.add_metric(values, stats.avg_decoded_tokens_per_iter)
        yield decoded
        if stats.speculative:
            yield from _speculation(stats, names, values)
        computed = CounterMetricFamily("trtfleet_reference_prefill_tokens_computed",
                                       "Prompt positions the model computed (reused KV-cache blocks are not).")
        computed.add_metric([], stats.prefill_tokens_computed)
        yield computed
        prompts = CounterMetricFamily("trtfleet_reference_prefill_prompt_tokens",
                                      "Prompt positions of the requests that started prefill.")
        prompts.add_metric([], stats.prompt_tokens)
        yield prompts
        lora = self._lora()
        if lora is None:
            return
        loads = CounterMetricFamily("trtfleet_reference_lora_loads", "Adapters read from lora_path into the cache.")
        loads.add_metric([], len(lora["loads"]))
        yield loads
        evictions = CounterMetricFamily("trtfleet_reference_lora_evictions", "Adapters evicted, by tier.",
                                        labels=["tier"])
        evictions.add_metric(["host"], len(lora["hostEvictions"]))
        evictions.add_metric(["device"], len(lora["deviceEvictions"]))
        yield evictions
        waits = CounterMetricFamily("trtfleet_reference_lora_device_waits",
                                    "Steps a request waited because every device page was in use.")
        waits.add_metric([], lora["deviceWaits"])
        yield waits
        for tier in ("host", "device"):
            resident = GaugeMetricFamily(f"trtfleet_reference_lora_{tier}_resident_adapters",
                                         f"Adapters in the {tier} tier.")
            resident.add_metric([], len(lora[f"{tier}Resident"]))
            yield resident


def _speculation(stats: BatcherStats, names: list[str], values: list[str]) -> Iterator[
        GaugeMetricFamily | CounterMetricFamily]:
    for name, text, value in (
        ("trtllm_spec_decode_num_draft_tokens", "Draft tokens proposed.", stats.spec_draft_tokens),
        ("trtllm_spec_decode_num_accepted_tokens", "Draft tokens accepted.", stats.spec_accepted_tokens),
    ):
        counter = CounterMetricFamily(name, text, labels=names)
        counter.add_metric(values, value)
        yield counter
    length = GaugeMetricFamily("trtllm_spec_decode_acceptance_length",
                               "Tokens per step of a request that drafted, last iteration.", labels=names)
    length.add_metric(values, stats.spec_acceptance_length)
    yield length
    per_adapter = adapter_values(stats)
    for kind in ("draft", "accepted"):
        family = CounterMetricFamily(f"trtfleet_reference_spec_decode_adapter_{kind}_tokens",
                                     f"Draft tokens {'proposed' if kind == 'draft' else 'accepted'} per LoRA id "
                                     "(0: the base model; not a TRT-LLM metric).", labels=["lora_id"])
        for (task_id, series), count in per_adapter.items():
            if series == f"{kind}_tokens":
                family.add_metric([str(task_id)], count)
        yield family


class ServeMetrics:
    """Request metrics, recorded by the HTTP layer when a request ends."""

    def __init__(self, stats: Callable[[], BatcherStats], lora: Callable[[], dict[str, Any] | None]) -> None:
        self.registry = CollectorRegistry()
        names = list(LABELS)
        self.request_success = Counter("trtllm_request_success", "Requests finished.", names + ["finished_reason"],
                                       registry=self.registry)
        self.e2e_latency = Histogram("trtllm_e2e_request_latency_seconds", "Request latency, arrival to last token.",
                                     names, buckets=LATENCY_BUCKETS_S, registry=self.registry)
        self.ttft = Histogram("trtllm_time_to_first_token_seconds", "Arrival to first token.", names,
                              buckets=LATENCY_BUCKETS_S, registry=self.registry)
        self.prompt_tokens = Counter("trtllm_prompt_tokens", "Prompt tokens processed.", names,
                                     registry=self.registry)
        self.generation_tokens = Counter("trtllm_generation_tokens", "Tokens generated.", names,
                                         registry=self.registry)
        self.registry.register(_EngineCollector(stats, lora))

    def finished(self, *, reason: str, latency_s: float, ttft_s: float | None, prompt: int, generated: int) -> None:
        self.request_success.labels(**LABELS, finished_reason=reason).inc()
        self.e2e_latency.labels(**LABELS).observe(latency_s)
        if ttft_s is not None:
            self.ttft.labels(**LABELS).observe(ttft_s)
        self.prompt_tokens.labels(**LABELS).inc(prompt)
        self.generation_tokens.labels(**LABELS).inc(generated)

    def render(self) -> bytes:
        return generate_latest(self.registry)
