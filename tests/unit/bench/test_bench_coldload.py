"""The cold-load price the real runs give the router: median TTFT difference less the priced bytes."""

from __future__ import annotations

import dataclasses

import pytest
from trtfleet_router.routing import parse_routing_config

from bench.coldload import ColdLoad
from bench.realscenario import RealScenario


def test_the_fixed_part_is_the_median_difference_less_the_priced_bytes() -> None:
    load = ColdLoad("tensorrtllm", cold_s=(0.030, 0.050, 0.031), warm_s=(0.020, 0.020, 0.020),
                    weights_bytes=1_000_000, bytes_per_s=1e9)
    assert load.load_s == pytest.approx(0.011)  # differences 10, 30, 11 ms
    assert load.overhead_s == pytest.approx(0.010)  # less 1 ms of bytes
    assert load.policy_config() == {"loadOverheadS": 0.01}


def test_a_load_cheaper_than_its_bytes_prices_no_fixed_part_and_pytorch_sets_its_own_key() -> None:
    load = ColdLoad("pytorch", cold_s=(0.020,), warm_s=(0.021,), weights_bytes=10**6, bytes_per_s=5e8)
    assert load.overhead_s == 0.0
    assert load.policy_config() == {"podReadOverheadS": 0.0}


def test_the_scenario_gives_both_trtfleet_policies_the_price_and_trtfleet_its_bound() -> None:
    scenario = dataclasses.replace(RealScenario(), load_price=(("loadOverheadS", 0.002),))
    config = parse_routing_config({"policy": "ttft-cost", **scenario.policy_config()})
    priced = config.sections["ttft_cost"]
    adapter_only = config.sections["adapter_affinity"]
    assert priced.load_overhead_s == adapter_only.load_overhead_s == 0.002  # type: ignore[attr-defined]
    assert priced.load_bound_inflight == scenario.load_bound_inflight  # type: ignore[attr-defined]
