"""The real runs' scenario: the reference workers, the adapters, the trace and the router's routing config that
every run on real processes shares (:mod:`bench.routing`, :mod:`bench.coldload`, :mod:`bench.routing_pytorch`,
:mod:`bench.prefix_realfleet`, :mod:`bench.replicas_real`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bench import report
from bench.traces import FleetLimits, LengthSpec, TraceSpec

WORK = report.RESULTS / "real"


@dataclass(frozen=True, slots=True)
class RealScenario:
    workers: int = 3
    adapters: int = 50
    adapter_pages_per_worker: int = 4
    zipf_alpha: float = 1.0
    rate_per_s: float = 8.0
    duration_s: float = 30.0
    min_step_ms: float = 20.0
    max_batch_size: int = 8
    # trtfleet's load bound (requests a warm pod may carry beyond the least loaded one) must stay below the
    # engine's max batch: the default 12 suits batches of 64+, here it let a warm pod queue requests behind
    # a full batch of 8 for a whole service time (the p99 TTFT of 2.2 s before 2026-11-22).
    load_bound_inflight: int = 4
    seed: int = 21
    # what a cold load costs these workers beyond its bytes (bench.coldload measures it before a run), priced
    # by both trtfleet policies: ``(("loadOverheadS", s),)`` or ``(("podReadOverheadS", s),)``; () the defaults
    load_price: tuple[tuple[str, float], ...] = ()

    def policy_config(self) -> dict[str, dict[str, Any]]:
        """The router's routing config in the real runs: trtfleet's load bound and the measured load price."""
        price = dict(self.load_price)
        return {"ttft_cost": {"loadBoundInflight": self.load_bound_inflight, **price}, "adapter_affinity": price}

    @staticmethod
    def limits() -> FleetLimits:
        """The reference workers' engine limits; the byte tokenizer adds ``<bos>`` and ``<sep>`` to a prompt."""
        from trtfleet_engines.reference.repository import default_reference_spec

        engine = default_reference_spec().engine
        return FleetLimits(max_input_tokens=engine.max_input_len, max_seq_tokens=engine.max_seq_len,
                           prompt_overhead_tokens=2)

    def trace_spec(self) -> TraceSpec:
        # Prompts are capped at what the engine accepts (126 text tokens for maxInputLen 128): before
        # 2026-11-25 the cap was 200 and 16 of 240 requests were refused with 400, counted against every policy.
        return TraceSpec(
            name="real", num_adapters=self.adapters, zipf_alpha=self.zipf_alpha, rate_per_s=self.rate_per_s,
            num_requests=int(self.rate_per_s * self.duration_s), seed=self.seed, adapter_prefix="s",
            prompt=LengthSpec(median=48, sigma=0.6, min_tokens=8, max_tokens=self.limits().max_prompt_tokens),
            output=LengthSpec(median=24, sigma=0.5, min_tokens=4, max_tokens=64),
        )


def host_cache_bytes_for(pages: int) -> tuple[int, int]:
    """Host-tier bytes that hold exactly ``pages`` pages of the tiny model, and one adapter's pages."""
    from trtfleet_engines.reference.repository import default_reference_spec

    from bench.realfleet import tiny_config
    from trtfleet.api.basemodel import ModelDimensions
    from trtfleet.loracache import LoraCacheConfig, adapter_pages, lora_module_shapes, plan_lora_geometry

    config = tiny_config()
    spec = default_reference_spec()
    dims = ModelDimensions(
        hidden_size=config["hidden_size"], intermediate_size=config["intermediate_size"],
        num_layers=config["num_hidden_layers"], num_attention_heads=config["num_attention_heads"],
        num_kv_heads=config["num_key_value_heads"], head_dim=config.get("head_dim"),
        vocab_size=config["vocab_size"],
    )
    geometry = plan_lora_geometry(
        lora_module_shapes(dims, spec.lora.target_modules),
        LoraCacheConfig(optimal_adapter_size=spec.lora.cache.optimal_adapter_size,
                        max_adapter_size=spec.lora.cache.max_adapter_size, max_lora_rank=spec.lora.max_rank,
                        dtype_bytes=2, num_layers=dims.num_layers),
    )
    per_adapter = adapter_pages(geometry, spec.lora.max_rank)
    return pages * geometry.page_width * geometry.slots_per_page * geometry.dtype_bytes, per_adapter
