"""The demo's pure parts: fleet planning (one spec for workers and router) and the live summary."""

from __future__ import annotations

from pathlib import Path

import pytest

from trtfleet.api import BaseModel
from trtfleet.demo import parse_adapters
from trtfleet.demo.batch import batch_example
from trtfleet.demo.fleet import (
    DTYPE_BYTES,
    ConvertedAdapter,
    ServeTiers,
    WorkerEndpoint,
    build_basemodel,
    build_fleet_config,
    build_pytorch_fleet_config,
    plan_spec,
)
from trtfleet.demo.summary import FleetSummary, counter_totals, format_summary, summarize, warm_adapters
from trtfleet.loracache import LoraCacheConfig, lora_module_shapes, plan_lora_geometry, tier_pages

# A small Llama config.json (the tiny model's own numbers do not matter to these tests).
CONFIG = {"hidden_size": 64, "intermediate_size": 176, "num_hidden_layers": 2, "num_attention_heads": 4,
          "num_key_value_heads": 2, "vocab_size": 260}
MODULES = ("attn_q", "attn_k", "attn_v", "attn_dense", "mlp_h_to_4h", "mlp_4h_to_h", "mlp_gate")


def adapter(sample: str, rank: int = 8) -> ConvertedAdapter:
    return ConvertedAdapter(sample, Path(f"/demo/adapters/{sample}"), rank, MODULES, 1000)


@pytest.mark.parametrize(("per_worker", "ranks"), [(1, (8, 8, 8)), (2, (8, 8, 8)), (2, (4, 8, 2)), (3, (8,))])
def test_host_cache_holds_exactly_the_planned_adapters(per_worker: int, ranks: tuple[int, ...]) -> None:
    adapters = [adapter(name, rank) for name, rank in zip(("upper", "reverse", "json"), ranks, strict=False)]
    spec, cache = plan_spec(CONFIG, adapters, per_worker)
    assert spec.lora.cache.host_bytes == cache.host_bytes
    assert cache.host_pages == cache.pages_per_adapter * per_worker
    assert spec.dimensions is not None
    geometry = plan_lora_geometry(
        lora_module_shapes(spec.dimensions, spec.lora.target_modules),
        LoraCacheConfig(spec.lora.cache.optimal_adapter_size, spec.lora.cache.max_adapter_size,
                        spec.lora.max_rank, DTYPE_BYTES, spec.dimensions.num_layers))
    assert tier_pages(geometry, cache.host_bytes) == cache.host_pages  # what worker and router both compute


@pytest.mark.parametrize(
    ("report", "tiers"),
    [
        ({"hostPages": 3, "devicePages": 2, "deviceAdapters": 2}, ServeTiers(3, 2, 1)),
        ({"hostPages": 8, "devicePages": 4, "deviceAdapters": 1}, ServeTiers(8, 4, 4)),
    ],
)
def test_pytorch_fleet_carries_the_tiers_the_worker_reports(report: dict[str, int], tiers: ServeTiers) -> None:
    assert ServeTiers.from_report(report) == tiers
    workers = [WorkerEndpoint("worker-1", 1, 0, 0)]
    fleet = build_pytorch_fleet_config(workers, [adapter("reverse")], tiers)["baseModels"][0]
    assert (fleet["runtime"], fleet["hostPages"], fleet["devicePages"]) == ("pytorch", tiers.host_pages,
                                                                            tiers.device_pages)
    assert fleet["backends"] == [{"address": "127.0.0.1:1", "podId": "worker-1"}]  # trtllm-serve's HTTP port
    assert fleet["adapters"] == [{"servedName": "tiny-reverse", "taskId": 2, "artifact": "/demo/adapters/reverse",
                                  "pages": tiers.pages_per_adapter}]


def test_worker_spec_and_fleet_config_share_one_spec() -> None:
    adapters = [adapter("upper"), adapter("json")]
    spec, _ = plan_spec(CONFIG, adapters, 2)
    basemodel = BaseModel.model_validate(build_basemodel(spec))
    assert basemodel.metadata["name"] == "tiny" and basemodel.spec == spec
    assert basemodel.spec.runtime.value == "reference"
    workers = [WorkerEndpoint("worker-1", 1, 2, 3), WorkerEndpoint("worker-2", 4, 5, 6)]
    fleet = build_fleet_config(spec, workers, adapters)["baseModels"][0]
    assert fleet["spec"] == build_basemodel(spec)["spec"]
    assert fleet["backends"] == [
        {"address": "127.0.0.1:2", "metrics": "127.0.0.1:3", "http": "127.0.0.1:1", "podId": "worker-1"},
        {"address": "127.0.0.1:5", "metrics": "127.0.0.1:6", "http": "127.0.0.1:4", "podId": "worker-2"},
    ]
    # Task ids follow the sample order whatever the selection: json is 3 even without reverse.
    assert [(a["servedName"], a["taskId"]) for a in fleet["adapters"]] == [("tiny-upper", 1), ("tiny-json", 3)]


@pytest.mark.parametrize(("text", "names"), [("upper,reverse,json", ["upper", "reverse", "json"]),
                                             (" json , upper", ["json", "upper"]), ("upper", ["upper"])])
def test_parse_adapters(text: str, names: list[str]) -> None:
    assert parse_adapters(text) == names


@pytest.mark.parametrize("text", ["", "upper,upper", "lower", "upper,,bogus"])
def test_parse_adapters_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="--adapters"):
        parse_adapters(text)


METRICS = """\
# HELP trtfleet_router_requests_total Client requests.
# TYPE trtfleet_router_requests_total counter
trtfleet_router_requests_total{code="ok",frontend="openai",model_kind="adapter"} 5.0
trtfleet_router_requests_total{code="ok",frontend="openai",model_kind="base"} 1.0
trtfleet_router_requests_total{code="overloaded",frontend="openai",model_kind="adapter"} 2.0
# HELP trtfleet_router_adapter_cache_hits_total Hits.
# TYPE trtfleet_router_adapter_cache_hits_total counter
trtfleet_router_adapter_cache_hits_total{adapter="tiny-upper"} 3.0
trtfleet_router_adapter_cache_hits_total{adapter="tiny-json"} 1.0
# HELP trtfleet_router_adapter_loads_total Loads.
# TYPE trtfleet_router_adapter_loads_total counter
trtfleet_router_adapter_loads_total{adapter="tiny-upper"} 1.0
# HELP trtfleet_router_weight_store_bytes Bytes.
# TYPE trtfleet_router_weight_store_bytes gauge
trtfleet_router_weight_store_bytes 12345.0
"""
FLEETS = {"tiny": {"pods": [{"pod_id": "worker-2", "resident_task_ids": [3]},
                            {"pod_id": "worker-1", "resident_task_ids": [3, 1, 9]}]}}
NAMES = {1: "tiny-upper", 2: "tiny-reverse", 3: "tiny-json"}


def test_counters_fold_labels_and_split_requests_by_outcome() -> None:
    totals = counter_totals(METRICS)
    assert totals["trtfleet_router_requests_total_ok"] == 6
    assert totals["trtfleet_router_requests_total_failed"] == 2
    assert totals["trtfleet_router_adapter_cache_hits_total"] == 4
    assert "trtfleet_router_weight_store_bytes" not in totals  # gauges are not counted


def test_summary_from_router_metrics_and_debug_fleets() -> None:
    assert warm_adapters(FLEETS, NAMES) == {"worker-1": ("tiny-upper", "tiny-json", "task 9"),
                                            "worker-2": ("tiny-json",)}
    summary = summarize(METRICS, FLEETS, NAMES, 2, 2)
    assert (summary.requests_ok, summary.requests_failed, summary.cache_hits, summary.adapter_loads) == (6, 2, 4, 1)
    assert summary.hit_rate == pytest.approx(0.8)
    assert format_summary(summary) == (
        "workers 2/2 ready · requests 6 ok, 2 failed · adapter hit rate 80% (4 warm, 1 loads, 0 misses)\n"
        "  warm: worker-1: tiny-upper, tiny-json, task 9    worker-2: tiny-json")


def test_summary_before_any_adapter_request() -> None:
    summary = FleetSummary(1, 2, 0, 0, 0, 0, 0, {"worker-1": ()})
    assert summary.hit_rate is None
    assert format_summary(summary).startswith("workers 1/2 ready · requests 0 ok, 0 failed · adapter hit rate n/a")


def test_the_batch_example_is_python_with_one_line_per_model() -> None:
    snippet = "\n".join(line[2:] for line in batch_example("http://127.0.0.1:8080", ["tiny", "tiny-upper"], "hi", 8))
    compile(snippet, "<demo batch example>", "exec")
    assert snippet.count('"custom_id"') == 2 and "purpose='batch'" in snippet and "completion_window='24h'" in snippet
