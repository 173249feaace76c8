"""Who a request is and how important (pure): the routing file's ``tenancy`` block and :func:`classify`."""

from __future__ import annotations

import re
from dataclasses import dataclass

import pydantic
import pytest
from trtfleet_router.routing import RoutingConfig
from trtfleet_router.routing.fairqueue import Priority
from trtfleet_router.routing.policies import parse_routing_config
from trtfleet_router.routing.tenancy import ServedShares, TenancyConfig, classify, may_take_reserved

CRIT, INTER, SHED, BATCH = Priority.CRITICAL, Priority.INTERACTIVE, Priority.SHEDDABLE, Priority.BATCH

CONFIG = TenancyConfig.model_validate(
    {
        "tenants": {
            "chat": {"weight": 3, "priority": "critical"},
            "analytics": {"priority": "sheddable"},
            "research": {"requestPriority": True},
        },
        "adapters": {"nightly-sql": "sheddable"},
        "objectives": {"premium": "critical"},
    }
)


@dataclass(frozen=True)
class ClassCase:
    tenant: str
    band: Priority
    adapter: str | None = None
    objective: str | None = None
    requested: float | None = None
    batch: bool = False
    kubernetes: tuple[tuple[str, int], ...] = ()


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(ClassCase("someone", INTER), id="unlisted tenant: interactive"),
        pytest.param(ClassCase("chat", CRIT), id="the tenant's band"),
        pytest.param(ClassCase("chat", SHED, adapter="nightly-sql"), id="the adapter's band before the tenant's"),
        pytest.param(ClassCase("analytics", CRIT, objective="premium"), id="a gateway's objective replaces both"),
        pytest.param(ClassCase("x", SHED, objective="bulk", kubernetes=(("bulk", -5),)), id="objective priority < 0"),
        pytest.param(ClassCase("x", CRIT, objective="gold", kubernetes=(("gold", 10),)), id="objective priority > 0"),
        pytest.param(ClassCase("x", INTER, objective="zero", kubernetes=(("zero", 0),)), id="objective priority 0"),
        pytest.param(ClassCase("x", INTER, objective="unknown"), id="an unknown objective changes nothing"),
        pytest.param(ClassCase("x", CRIT, objective="premium", kubernetes=(("premium", -1),)), id="the file wins"),
        pytest.param(ClassCase("chat", SHED, requested=0.1), id="a request may always lower its band"),
        pytest.param(ClassCase("x", INTER, requested=0.9), id="raising needs requestPriority"),
        pytest.param(ClassCase("research", CRIT, requested=0.9), id="raising where allowed"),
        pytest.param(ClassCase("research", INTER, requested=0.5), id="0.5 is interactive"),
        pytest.param(ClassCase("chat", BATCH, requested=1.0, batch=True), id="batch lines are batch"),
    ],
)
def test_classify(case: ClassCase) -> None:
    got = classify(
        CONFIG,
        case.tenant,
        adapter=case.adapter,
        objective=case.objective,
        objective_priorities=dict(case.kubernetes),
        requested=case.requested,
        batch=case.batch,
    )
    assert (got.tenant, got.band) == (case.tenant, case.band)


def test_the_block_is_validated_when_the_routing_file_is_read() -> None:
    config = parse_routing_config(
        {"tenancy": {"order": "llmd-round-robin", "saturation": {"inflightPerPod": 8}, "tenants": {"a": {"weight": 2}}}}
    )
    assert isinstance(config, RoutingConfig)
    assert config.tenancy.order == "llmd-round-robin" and config.tenancy.saturation.enabled
    assert config.tenancy.weights() == {"a": 2.0}
    assert not RoutingConfig().tenancy.saturation.enabled  # off unless asked for
    for bad in (
        {"order": "lottery"},
        {"tenants": {"a": {"weight": 0}}},
        {"tenants": {"a": {"priority": "urgent"}}},
        {"saturation": {"inflightPerPod": -1}},
        {"adapters": {"x": "high"}},
    ):
        with pytest.raises(pydantic.ValidationError):
            TenancyConfig.model_validate(bad)


def test_served_shares_name_the_tenant_over_its_weight() -> None:
    clock = [0.0]
    shares = ServedShares(lambda: clock[0], half_life_s=10.0)
    shares.add("a", 900)
    shares.add("b", 100)
    weights = {"a": 1.0, "b": 1.0}.__getitem__
    over = shares.over_share("a", weights)
    assert over is not None and over == pytest.approx((0.9, 0.5))
    assert shares.over_share("b", weights) is None
    assert shares.over_share("a", {"a": 9.0, "b": 1.0}.__getitem__) is None  # 90 % is a's fair share by weight
    clock[0] = 100.0  # ten half-lives later a's flood is forgotten ...
    shares.add("b", 100)
    assert shares.over_share("a", weights) is None  # ... and b, served since, is the one ahead
    alone = ServedShares(lambda: 0.0)
    alone.add("a", 5)
    assert alone.over_share("a", weights) is None  # nobody to share with


@pytest.mark.parametrize(
    ("saturation", "message"),
    [
        pytest.param({"inflightPerPod": 4, "reservedPerPod": 4}, "must be below inflightPerPod (4)", id="all"),
        pytest.param({"inflightPerPod": 0, "reservedPerPod": 1}, "must be below inflightPerPod (0)", id="no limit"),
        pytest.param({"inflightPerPod": 4, "reservedPerPod": -1}, "greater than or equal to 0", id="negative"),
        pytest.param({"detector": "llmd-utilization", "inflightPerPod": 4, "reservedPerPod": 1},
                     "needs the inflight detector", id="other detector"),
    ],
)
def test_reserved_slots_are_validated(saturation: dict[str, object], message: str) -> None:
    with pytest.raises(pydantic.ValidationError, match=re.escape(message)):
        TenancyConfig.model_validate({"saturation": saturation})


def test_reserved_slots_limit_only_a_request_that_may_not_take_them() -> None:
    saturation = TenancyConfig.model_validate({"saturation": {"inflightPerPod": 4, "reservedPerPod": 1}}).saturation
    assert saturation.reserving and (saturation.limit(True), saturation.limit(False)) == (4, 3)
    unset = TenancyConfig.model_validate({"saturation": {"inflightPerPod": 4}}).saturation
    assert not unset.reserving and (unset.limit(True), unset.limit(False)) == (4, 4)


@pytest.mark.parametrize(
    ("band", "over_share", "may"),
    [
        (Priority.CRITICAL, False, True),
        (Priority.INTERACTIVE, False, True),
        (Priority.CRITICAL, True, False),
        (Priority.INTERACTIVE, True, False),
        (Priority.SHEDDABLE, False, False),
        (Priority.BATCH, False, False),
    ],
)
def test_who_may_take_a_reserved_slot(band: Priority, over_share: bool, may: bool) -> None:
    assert may_take_reserved(band, over_share) is may
