"""trtfleet's routing policies and the registry of every policy: the one place a policy is named.

``ttft-cost`` (the default), ``tiered-cost`` (``ttft-cost`` over both LoRA tiers, following the placement plan)
and ``adapter-affinity`` are trtfleet's own; the others are re-implementations of
other projects' policies for comparison (``routing/baselines``). Each policy module has ``NAME``,
``build(config) -> Policy`` and, when it has parameters, ``SECTION`` (its block in the routing YAML) with its own
pydantic model. A new policy is one module plus one line in :data:`REGISTRY`. The CLI validates the file once at
start-up (:func:`parse_routing_config`); an unknown policy name, an unknown block or a bad value fails there. The
names before 0.x's rename (``trtfleet``, ``trtfleet-adapter`` and their blocks) are still accepted, with a
deprecation warning. The framework never imports a policy (the import-linter contract ``routing-layers``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pydantic

from trtfleet_router.routing.baselines import (
    chwbl,
    dynamo_hrw,
    dynamo_kv,
    gie_lora_affinity,
    kubeai_prefix_hash,
    least_load,
    llmd_default,
    round_robin,
)
from trtfleet_router.routing.config import RoutingConfig, read_routing_file
from trtfleet_router.routing.framework import Policy
from trtfleet_router.routing.policies import adapter_affinity, tiered_cost, ttft_cost
from trtfleet_router.routing.types import RoutingConfigError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PolicyEntry:
    build: Callable[[RoutingConfig], Policy]
    section: tuple[str, type[pydantic.BaseModel]] | None = None
    """The policy's YAML block and its model, when it has parameters."""


REGISTRY: dict[str, PolicyEntry] = {
    round_robin.NAME: PolicyEntry(round_robin.build),
    least_load.NAME: PolicyEntry(least_load.build),
    gie_lora_affinity.NAME: PolicyEntry(
        gie_lora_affinity.build, (gie_lora_affinity.SECTION, gie_lora_affinity.GieLoraAffinityConfig)
    ),
    chwbl.NAME: PolicyEntry(chwbl.build, (chwbl.SECTION, chwbl.ChwblConfig)),
    llmd_default.NAME: PolicyEntry(llmd_default.build, (llmd_default.SECTION, llmd_default.LlmdDefaultConfig)),
    kubeai_prefix_hash.NAME: PolicyEntry(
        kubeai_prefix_hash.build, (kubeai_prefix_hash.SECTION, chwbl.ChwblConfig)
    ),
    dynamo_kv.NAME: PolicyEntry(dynamo_kv.build, (dynamo_kv.SECTION, dynamo_kv.DynamoKvConfig)),
    dynamo_hrw.NAME: PolicyEntry(dynamo_hrw.build, (dynamo_hrw.SECTION, dynamo_hrw.DynamoHrwConfig)),
    adapter_affinity.NAME: PolicyEntry(
        adapter_affinity.build, (adapter_affinity.SECTION, adapter_affinity.AdapterAffinityConfig)
    ),
    ttft_cost.NAME: PolicyEntry(ttft_cost.build, (ttft_cost.SECTION, ttft_cost.TtftCostConfig)),
    tiered_cost.NAME: PolicyEntry(tiered_cost.build, (tiered_cost.SECTION, tiered_cost.TieredCostConfig)),
}
RENAMED: dict[str, str] = {"trtfleet": ttft_cost.NAME, "trtfleet-adapter": adapter_affinity.NAME}
"""Old policy name -> its name now."""
RENAMED_SECTIONS: dict[str, str] = {"trtfleet": ttft_cost.SECTION, "trtfleet_adapter": adapter_affinity.SECTION}
"""Old policy block -> its block now."""


def policy_names() -> tuple[str, ...]:
    return tuple(REGISTRY)


def build_policy(config: RoutingConfig) -> Policy:
    """The configured policy; an unknown name fails here too, listing the known ones."""
    entry = REGISTRY.get(RENAMED.get(config.policy, config.policy))
    if entry is None:
        raise RoutingConfigError(f"unknown routing policy {config.policy!r}; known: {', '.join(REGISTRY)}")
    return entry.build(config)


def parse_routing_config(data: Any) -> RoutingConfig:
    """A validated config from parsed YAML/JSON (None or empty: all defaults): the common settings, the
    policy name and every policy block (each against its policy's model, so a typo in a block of a
    policy not chosen still fails)."""
    try:
        config = RoutingConfig.model_validate(data or {})
    except pydantic.ValidationError as exc:
        raise RoutingConfigError(f"invalid routing configuration: {exc}") from exc
    config = _renamed(config)
    if config.policy not in REGISTRY:
        raise RoutingConfigError(f"unknown routing policy {config.policy!r}; known: {', '.join(REGISTRY)}")
    models = dict(entry.section for entry in REGISTRY.values() if entry.section is not None)
    unknown = sorted(set(config.sections) - set(models))
    if unknown:
        raise RoutingConfigError(
            f"invalid routing configuration: unknown keys {unknown}; policy blocks: {', '.join(models)}"
        )
    sections: dict[str, pydantic.BaseModel] = {}
    for name, model in models.items():
        try:
            sections[name] = config.section(name, model)
        except pydantic.ValidationError as exc:
            raise RoutingConfigError(f"invalid routing configuration, block {name!r}: {exc}") from exc
    return config.model_copy(update={"sections": sections})


def _renamed(config: RoutingConfig) -> RoutingConfig:
    """``config`` with the policy's old name and old blocks under their names now (each with a warning)."""
    policy = config.policy
    if policy in RENAMED:
        policy = RENAMED[policy]
        log.warning("routing policy %r is now called %r; the old name will be removed", config.policy, policy)
    sections = dict(config.sections)
    for old, new in RENAMED_SECTIONS.items():
        if old in sections:
            if new in sections:
                raise RoutingConfigError(f"invalid routing configuration: both {old!r} and its new name {new!r}")
            log.warning("routing block %r is now called %r; the old name will be removed", old, new)
            sections[new] = sections.pop(old)
    if policy == config.policy and sections == config.sections:
        return config
    return config.model_copy(update={"policy": policy, "sections": sections})


def load_routing_config(path: Path) -> RoutingConfig:
    """Read and validate the YAML file at ``path``."""
    return parse_routing_config(read_routing_file(path))
