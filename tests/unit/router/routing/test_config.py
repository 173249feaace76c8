"""The YAML routing configuration and the policy registry."""

from __future__ import annotations

from pathlib import Path

import pytest
from trtfleet_router.routing import (
    RoutingConfig,
    RoutingConfigError,
    build_policy,
    load_routing_config,
    parse_routing_config,
    policy_names,
)
from trtfleet_router.routing.baselines.chwbl import ChwblConfig
from trtfleet_router.routing.baselines.gie_lora_affinity import GieLoraAffinityConfig
from trtfleet_router.routing.policies.adapter_affinity import AdapterAffinityConfig
from trtfleet_router.routing.policies.ttft_cost import TtftCostConfig


def test_defaults() -> None:
    config = parse_routing_config(None)
    assert config.policy == "ttft-cost"
    ring = config.section("chwbl", ChwblConfig)
    assert (ring.load_factor, ring.virtual_nodes) == (1.25, 256)
    weights = config.section("gie_lora_affinity", GieLoraAffinityConfig)
    assert (weights.queue_weight, weights.kv_cache_weight, weights.lora_affinity_weight) == (2, 2, 1)
    assert 8 <= config.section("ttft_cost", TtftCostConfig).load_bound_inflight <= 16


def test_old_policy_names_still_work_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING"):
        config = parse_routing_config({"policy": "trtfleet-adapter", "trtfleet": {"loadBoundInflight": 3},
                                       "trtfleetAdapter": {"homePods": 5}})
    assert config.policy == "adapter-affinity"
    assert config.section("ttft_cost", TtftCostConfig).load_bound_inflight == 3
    assert config.section("adapter_affinity", AdapterAffinityConfig).home_pods == 5
    assert "'trtfleet-adapter' is now called 'adapter-affinity'" in caplog.text
    assert "'trtfleet' is now called 'ttft_cost'" in caplog.text
    assert parse_routing_config({"policy": "trtfleet"}).policy == "ttft-cost"
    with pytest.raises(RoutingConfigError, match="both 'trtfleet' and its new name 'ttft_cost'"):
        parse_routing_config({"trtfleet": {}, "ttftCost": {}})


def test_yaml_file_camel_and_snake_case(tmp_path: Path) -> None:
    path = tmp_path / "routing.yaml"
    path.write_text(
        "policy: chwbl\nmetricsStaleAfterS: 2\nchwbl: {load_factor: 1.5}\ntrtfleet:\n  loadBoundInflight: 8\n"
    )
    config = load_routing_config(path)
    assert (config.policy, config.metrics_stale_after_s) == ("chwbl", 2)
    ring, trtfleet = config.section("chwbl", ChwblConfig), config.section("ttft_cost", TtftCostConfig)
    assert (ring.load_factor, trtfleet.load_bound_inflight) == (1.5, 8)
    assert isinstance(config.sections["chwbl"], ChwblConfig), "every block is validated once, at load"
    assert build_policy(config).name == "chwbl"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"policy": "fastest"}, "unknown routing policy 'fastest'; known: round-robin, least-load"),
        ({"polcy": "trtfleet"}, "polcy"),
        ({"chwbl": {"loadFactor": 0.5}}, "loadFactor"),
        ({"policy": "chwbl", "trtfleet": {"homePods": 0}}, "homePods"),
    ],
)
def test_invalid_config_fails_at_load(data: dict[str, object], message: str) -> None:
    with pytest.raises(RoutingConfigError, match=message):
        parse_routing_config(data)


def test_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(RoutingConfigError, match="cannot read"):
        load_routing_config(tmp_path / "missing.yaml")
    (tmp_path / "bad.yaml").write_text("policy: [unclosed\n")
    with pytest.raises(RoutingConfigError, match="cannot read"):
        load_routing_config(tmp_path / "bad.yaml")


def test_build_policy_rejects_unknown_names_even_unvalidated() -> None:
    config = RoutingConfig.model_construct(policy="nope")
    with pytest.raises(RoutingConfigError, match="known: " + ", ".join(policy_names())):
        build_policy(config)


def test_every_registered_policy_builds_under_its_own_name() -> None:
    for name in policy_names():
        assert build_policy(parse_routing_config({"policy": name})).name == name


def test_the_charts_policy_enum_lists_every_registered_policy() -> None:
    import json
    from pathlib import Path

    from trtfleet_router.routing import policy_names
    from trtfleet_router.routing.policies import RENAMED

    schema = json.loads((Path(__file__).parents[4] / "charts" / "trtfleet" / "values.schema.json").read_text())

    def enums(node: object) -> list[list[str]]:
        if isinstance(node, dict):
            policy = node.get("policy")
            found = [policy["enum"]] if isinstance(policy, dict) and "enum" in policy else []
            return found + [e for value in node.values() for e in enums(value)]
        return []

    assert [sorted(e) for e in enums(schema)] == [sorted([*policy_names(), *RENAMED])]  # old names still accepted
