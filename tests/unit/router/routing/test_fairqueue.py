"""The admission order (pure): strict priority between bands, a tenant order inside each, what is shed first.

Each table row names the tenant order, the requests queued (in arrival order) and the order they leave in; the
tenant orders are trtfleet's virtual token counter (``vtc``), first come first served and llm-d's round robin.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from trtfleet_router.routing.baselines.llmd_flow_control import RoundRobinOrder
from trtfleet_router.routing.fairqueue import ArrivalOrder, FairQueue, Priority, TenantOrder
from trtfleet_router.routing.vtc import VirtualTokenCounters

CRIT, INTER, SHED, BATCH = Priority.CRITICAL, Priority.INTERACTIVE, Priority.SHEDDABLE, Priority.BATCH


@dataclass(frozen=True)
class Queued:
    name: str
    tenant: str
    band: Priority = INTER
    first: bool = False


@dataclass(frozen=True)
class OrderCase:
    order: str
    queued: tuple[Queued, ...]
    leaves: tuple[str, ...]
    counters: dict[str, float] = field(default_factory=dict)
    """vtc: counters the tenants start with (their service so far, in weighted tokens)."""


def build(name: str, counters: dict[str, float]) -> TenantOrder:
    if name == "vtc":
        order = VirtualTokenCounters()
        order.counters.update(counters)
        return order
    return RoundRobinOrder() if name == "round-robin" else ArrivalOrder()


CASES = [
    OrderCase(
        order="fcfs",
        queued=(Queued("b1", "b", SHED), Queued("i1", "a", INTER), Queued("c1", "a", CRIT), Queued("l1", "x", BATCH)),
        leaves=("c1", "i1", "b1", "l1"),
    ),
    OrderCase(
        order="vtc",
        queued=(Queued("l1", "x", BATCH), Queued("s1", "a", SHED), Queued("i1", "b", INTER), Queued("c1", "c", CRIT)),
        leaves=("c1", "i1", "s1", "l1"),
        counters={"a": 0.0, "b": 1e9, "c": 1e9},
    ),
    OrderCase(
        order="fcfs",
        queued=(Queued("a1", "a"), Queued("a2", "a"), Queued("b1", "b"), Queued("a3", "a")),
        leaves=("a1", "a2", "b1", "a3"),
    ),
    OrderCase(
        order="round-robin",
        queued=(Queued("a1", "a"), Queued("a2", "a"), Queued("a3", "a"), Queued("b1", "b"), Queued("b2", "b")),
        leaves=("a1", "b1", "a2", "b2", "a3"),
    ),
    OrderCase(
        order="vtc",
        queued=(Queued("b1", "b"), Queued("a1", "a"), Queued("a2", "a"), Queued("b2", "b")),
        leaves=("b1", "b2", "a1", "a2"),
        counters={"a": 500.0, "b": 0.0},
    ),
    OrderCase(
        order="fcfs",
        queued=(Queued("a1", "a"), Queued("a2", "a"), Queued("again", "a", first=True)),
        leaves=("again", "a1", "a2"),
    ),
    OrderCase(
        order="vtc",
        queued=(Queued("b1", "b"), Queued("a1", "a"), Queued("again", "a", first=True)),
        leaves=("again", "b1", "a1"),
        counters={"a": 10.0, "b": 10.0},
    ),
]


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(CASES[0], id="bands strictly by importance, batch last"),
        pytest.param(CASES[1], id="bands before tenants: the least-served tenant waits in a lower band"),
        pytest.param(CASES[2], id="fcfs: arrival order across tenants"),
        pytest.param(CASES[3], id="round robin: one turn per flow"),
        pytest.param(CASES[4], id="vtc: the least-served waiting tenant first while its counter stays lower"),
        pytest.param(CASES[5], id="a request put back goes first"),
        pytest.param(CASES[6], id="vtc: a request put back wins a tie of counters"),
    ],
)
def test_leave_order(case: OrderCase) -> None:
    queue: FairQueue[str] = FairQueue(build(case.order, case.counters))
    for item in case.queued:
        queue.push(item.name, item.band, item.tenant, first=item.first)
    left = []
    while (entry := queue.pop()) is not None:
        left.append(entry.item)
    assert tuple(left) == case.leaves
    assert len(queue) == 0 and not queue


@dataclass(frozen=True)
class ShedCase:
    queued: tuple[Queued, ...]
    newcomer: Queued
    pushed_out: str | None
    counters: dict[str, float] = field(default_factory=dict)


SHED_CASES = [
    ShedCase(
        queued=(Queued("s1", "a", SHED), Queued("s2", "b", SHED), Queued("i1", "a", INTER)),
        newcomer=Queued("new", "c", INTER),
        pushed_out="s2",
        counters={"a": 0.0, "b": 5.0},
    ),
    ShedCase(queued=(Queued("i1", "a", INTER),), newcomer=Queued("new", "b", SHED), pushed_out=None),
    ShedCase(queued=(Queued("l1", "x", BATCH),), newcomer=Queued("new", "b", INTER), pushed_out=None),
    ShedCase(
        queued=(Queued("a1", "a"), Queued("a2", "a"), Queued("a3", "a")),
        newcomer=Queued("b1", "b"),
        pushed_out="a3",
        counters={"a": 100.0, "b": 0.0},
    ),
    ShedCase(
        queued=(Queued("a1", "a"), Queued("b1", "b")),
        newcomer=Queued("b2", "b"),
        pushed_out=None,
        counters={"a": 0.0, "b": 100.0},
    ),
]


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(SHED_CASES[0], id="the lowest band goes first, its most-served tenant's newest"),
        pytest.param(SHED_CASES[1], id="nothing below the newcomer: it is the one turned away"),
        pytest.param(SHED_CASES[2], id="batch lines are never shed"),
        pytest.param(SHED_CASES[3], id="in its band a newcomer under its share takes the over-share tenant's place"),
        pytest.param(SHED_CASES[4], id="an over-share newcomer takes nobody's place"),
    ],
)
def test_a_full_line_makes_room(case: ShedCase) -> None:
    order = VirtualTokenCounters()
    order.counters.update(case.counters)
    queue: FairQueue[str] = FairQueue(order)
    for item in case.queued:
        queue.push(item.name, item.band, item.tenant)
    entry = queue.displaceable(case.newcomer.band, case.newcomer.tenant)
    assert (entry.item if entry is not None else None) == case.pushed_out


@dataclass(frozen=True)
class AheadCase:
    order: str
    queued: tuple[Queued, ...]
    newcomer: Queued
    ahead: int


AHEAD_CASES = [
    AheadCase("fcfs", tuple(Queued(f"a{i}", "a") for i in range(6)), Queued("b1", "b"), 6),
    AheadCase("vtc", tuple(Queued(f"a{i}", "a") for i in range(6)), Queued("b1", "b"), 1),
    AheadCase("vtc", tuple(Queued(f"a{i}", "a") for i in range(6)), Queued("a6", "a"), 6),
    AheadCase("vtc", (Queued("c1", "x", CRIT), *(Queued(f"a{i}", "a") for i in range(3))), Queued("b1", "b"), 2),
    AheadCase("round-robin", tuple(Queued(f"a{i}", "a") for i in range(6)), Queued("b1", "b"), 1),
]


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(AHEAD_CASES[0], id="fcfs: behind everyone"),
        pytest.param(AHEAD_CASES[1], id="vtc: a second tenant goes after one head"),
        pytest.param(AHEAD_CASES[2], id="vtc: the flooding tenant behind its own queue"),
        pytest.param(AHEAD_CASES[3], id="more important bands count in full"),
        pytest.param(AHEAD_CASES[4], id="round robin: one turn each"),
    ],
)
def test_expected_place_in_line(case: AheadCase) -> None:
    queue: FairQueue[str] = FairQueue(build(case.order, {}))
    for item in case.queued:
        queue.push(item.name, item.band, item.tenant)
    assert queue.ahead(case.newcomer.band, case.newcomer.tenant) == case.ahead


def test_remove_and_counts_by_band() -> None:
    queue: FairQueue[str] = FairQueue(ArrivalOrder())
    a = queue.push("a", INTER, "t")
    queue.push("c", CRIT, "t")
    queue.push("l", BATCH, "t")
    assert (queue.waiting(), queue.waiting(INTER), queue.waiting_from(INTER), queue.waiting_from(BATCH)) == (3, 1, 2, 3)
    assert queue.remove(a) and not queue.remove(a)
    assert queue.peek() is not None and queue.peek().item == "c"  # type: ignore[union-attr]
    assert [entry.item for entry in queue] == ["c", "l"]


@dataclass(frozen=True)
class EligibleCase:
    queued: tuple[Queued, ...]
    eligible: frozenset[str]
    """Tenants a wake-up may go to (a pod's reserved slot: those not flooding)."""
    newcomer_band: Priority
    ahead: int
    leaves: tuple[str, ...]


ELIGIBLE_CASES = [
    EligibleCase(
        queued=(Queued("a1", "a"), Queued("a2", "a"), Queued("b1", "b"), Queued("b2", "b")),
        eligible=frozenset({"b"}), newcomer_band=INTER, ahead=2, leaves=("b1", "b2"),
    ),
    EligibleCase(
        queued=(Queued("a1", "a", CRIT), Queued("b1", "b", SHED), Queued("b2", "b")),
        eligible=frozenset({"b"}), newcomer_band=INTER, ahead=1, leaves=("b2", "b1"),
    ),
    EligibleCase(
        queued=(Queued("a1", "a"),), eligible=frozenset(), newcomer_band=CRIT, ahead=0, leaves=(),
    ),
]


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(ELIGIBLE_CASES[0], id="the order's pick among eligible tenants only"),
        pytest.param(ELIGIBLE_CASES[1], id="bands still strictly by importance among the eligible"),
        pytest.param(ELIGIBLE_CASES[2], id="nobody eligible: nothing leaves, nothing counts ahead"),
    ],
)
def test_eligible_waiters_only(case: EligibleCase) -> None:
    queue: FairQueue[str] = FairQueue(build("vtc", {}))
    for item in case.queued:
        queue.push(item.name, item.band, item.tenant)

    def eligible(tenant: str, band: Priority) -> bool:
        return tenant in case.eligible

    assert queue.waiting_from(case.newcomer_band, eligible) == case.ahead
    left = []
    while (entry := queue.pop(eligible)) is not None:
        left.append(entry.item)
    assert tuple(left) == case.leaves
    assert len(queue) == len(case.queued) - len(case.leaves)
