"""The virtual token counter (Sheng et al., OSDI 2024) as the router's tenant order, pure: weights, token accounting,
the counter lift, and the bound on what a tenant that was idle can take when it returns.

A small service loop stands in for the fleet: ``slots`` requests run at a time; each step the one that started
first ends, its output charged, and the queue's next request starts (its prompt charged as it starts), as the
router charges its tenants.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import pytest
from trtfleet_router.routing.fairqueue import FairQueue, Priority
from trtfleet_router.routing.vtc import VirtualTokenCounters

INTER = Priority.INTERACTIVE


@dataclass(frozen=True)
class Job:
    tenant: str
    prompt: int
    output: int


def serve(queue: FairQueue[Job], order: VirtualTokenCounters, jobs: int, slots: int = 4) -> list[Job]:
    """Start ``jobs`` requests from ``queue`` (kept full by the caller's arrivals): the order they started in."""
    started: list[Job] = []
    running: deque[Job] = deque()
    while len(started) < jobs:
        while len(running) < slots:
            entry = queue.pop()
            if entry is None:
                break
            order.charge(entry.tenant, input_tokens=entry.item.prompt)
            running.append(entry.item)
            started.append(entry.item)
        if not running:
            break
        done = running.popleft()
        order.charge(done.tenant, output_tokens=done.output)
    return started


@dataclass(frozen=True)
class ShareCase:
    weights: dict[str, float]
    jobs: dict[str, Job]
    input_cost: float = 1.0
    output_cost: float = 2.0


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(ShareCase({}, {"a": Job("a", 100, 50), "b": Job("b", 100, 50)}), id="equal weights"),
        pytest.param(
            ShareCase({"a": 1.0, "b": 3.0}, {"a": Job("a", 100, 50), "b": Job("b", 100, 50)}), id="weights 1:3"
        ),
        pytest.param(
            ShareCase({}, {"a": Job("a", 800, 200), "b": Job("b", 50, 20)}),
            id="long requests do not buy a larger share",
        ),
        pytest.param(
            ShareCase({"a": 2.0, "b": 1.0}, {"a": Job("a", 10, 300), "b": Job("b", 600, 10)}, output_cost=1.0),
            id="weights 2:1 by total tokens, output-heavy against prompt-heavy",
        ),
    ],
)
def test_backlogged_tenants_share_tokens_by_weight(case: ShareCase) -> None:
    order = VirtualTokenCounters(case.weights, input_cost=case.input_cost, output_cost=case.output_cost)
    queue: FairQueue[Job] = FairQueue(order)
    for job in case.jobs.values():
        for _ in range(400):  # both stay backlogged throughout
            queue.push(job, INTER, job.tenant)
    started = serve(queue, order, jobs=300)
    served = {tenant: 0.0 for tenant in case.jobs}
    for job in started:
        served[job.tenant] += case.input_cost * job.prompt + case.output_cost * job.output
    total_weight = sum(order.weight(tenant) for tenant in case.jobs)
    largest = max(case.input_cost * j.prompt + case.output_cost * j.output for j in case.jobs.values())
    for tenant, tokens in served.items():
        fair = order.weight(tenant) / total_weight * sum(served.values())
        # within the paper's bound: a request's cost and what the running slots hold, per weight
        assert abs(tokens - fair) <= 2 * 4 * largest, (tenant, tokens, fair)
        assert tokens / sum(served.values()) == pytest.approx(order.weight(tenant) / total_weight, abs=0.1)


@dataclass(frozen=True)
class LiftCase:
    counters: dict[str, float]
    backlogged: tuple[str, ...]
    last_admitted: float | None
    tenant: str
    lifted: float


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(LiftCase({"a": 900.0, "b": 700.0}, ("a", "b"), None, "new", 700.0), id="to the least waiting"),
        pytest.param(LiftCase({"a": 900.0, "r": 50.0}, ("a",), None, "r", 900.0), id="returning after idling: lifted"),
        pytest.param(LiftCase({"a": 900.0, "r": 2000.0}, ("a",), None, "r", 2000.0), id="never lowered"),
        pytest.param(LiftCase({"r": 5.0}, (), 300.0, "r", 300.0), id="nobody waits: to the last one that left"),
    ],
)
def test_counter_lift(case: LiftCase) -> None:
    order = VirtualTokenCounters()
    order.counters.update(case.counters)
    if case.last_admitted is not None:
        order.counters["gone"] = case.last_admitted
        order.admitted("gone", INTER)
    order.joined(case.tenant, INTER, case.backlogged)
    assert order.counter(case.tenant) == case.lifted


SLOTS = 4


@dataclass(frozen=True)
class ReturnCase:
    weights: dict[str, float]
    idle_jobs: int
    """Requests tenant ``a`` is served alone first, while ``r`` is idle."""
    cost: Job = field(default_factory=lambda: Job("", 100, 50))


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(ReturnCase({}, 200), id="equal weights, after 200 requests of idling"),
        pytest.param(ReturnCase({}, 2000), id="ten times longer idle: the same bound"),
        pytest.param(ReturnCase({"r": 3.0}, 500), id="weight 3"),
        pytest.param(ReturnCase({"a": 3.0}, 500), id="the backlogged tenant weighs 3"),
    ],
)
def test_a_returning_tenant_gets_no_burst(case: ReturnCase) -> None:
    """However long ``r`` idled, once back its weighted service never runs ahead of the backlogged ``a``'s by more
    than the paper's bound, ``2 U`` with ``U`` what the running slots hold (no credit banked while idle)."""
    order = VirtualTokenCounters(case.weights)
    queue: FairQueue[Job] = FairQueue(order)
    a = Job("a", case.cost.prompt, case.cost.output)
    r = Job("r", case.cost.prompt, case.cost.output)
    for _ in range(case.idle_jobs + 400):
        queue.push(a, INTER, "a")
    serve(queue, order, jobs=case.idle_jobs, slots=SLOTS)  # r idle: a alone, its counter far ahead of r's zero
    for _ in range(300):  # both stay backlogged through the 200 starts measured
        queue.push(r, INTER, "r")
    started = serve(queue, order, jobs=200, slots=SLOTS)
    per_request = order.input_cost * r.prompt + order.output_cost * r.output
    bound = 2 * SLOTS * per_request / min(order.weight("a"), order.weight("r"))
    weighted = {"a": 0.0, "r": 0.0}
    lead = 0.0
    for job in started:
        weighted[job.tenant] += per_request / order.weight(job.tenant)
        lead = max(lead, weighted["r"] - weighted["a"])
    assert lead <= bound
    share = sum(1 for job in started if job.tenant == "r") / len(started)
    assert share == pytest.approx(order.weight("r") / (order.weight("r") + order.weight("a")), abs=0.1)


def test_without_the_lift_an_idle_tenant_would_burst() -> None:
    """The same return with the counter left where it was (no lift): what the bound above rules out."""
    order = VirtualTokenCounters()
    queue: FairQueue[Job] = FairQueue(order)
    for _ in range(600):
        queue.push(Job("a", 100, 50), INTER, "a")
    serve(queue, order, jobs=200, slots=SLOTS)
    for _ in range(100):
        queue.push(Job("r", 100, 50), INTER, "r")
    order.counters["r"] = 0.0  # undo the lift
    started = serve(queue, order, jobs=100, slots=SLOTS)
    assert all(job.tenant == "r" for job in started[SLOTS:100])


def test_an_idle_tenant_is_forgotten_first_and_lifted_when_it_returns() -> None:
    order = VirtualTokenCounters(max_tenants=3)
    order.counters.update({"busy": 500.0, "idle": 10.0, "other": 400.0})
    order.joined("fresh", INTER, ("busy",))
    assert set(order.counters) == {"busy", "other", "fresh"} and order.counter("fresh") == 500.0
    order.joined("idle", INTER, ("busy", "fresh"))
    assert order.counter("idle") == 500.0  # back at the floor, never at its old (lower) counter


def test_charges_are_weighted_tokens() -> None:
    order = VirtualTokenCounters({"gold": 4.0}, input_cost=1.0, output_cost=2.0)
    order.charge("gold", input_tokens=100, output_tokens=50)
    order.charge("plain", input_tokens=100, output_tokens=50)
    assert (order.counter("gold"), order.counter("plain")) == (50.0, 200.0)
