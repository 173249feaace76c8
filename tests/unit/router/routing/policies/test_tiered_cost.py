"""tiered-cost: the host-to-device copy priced, a transfer overlapped with the queue when no pod holds the adapter,
the placement's planned pods priced as cold candidates. Each case against ttft-cost on the same fleet.

Priced here: an 8 MiB adapter's cold load is 11.7 ms (5 ms fixed plus 6.7 ms over 1.25 GB/s), its copy 0.17 ms
(at 50 GB/s), a request in flight 5 ms of queue, a 16-token prompt 0.23 ms of prefill.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pytest
from trtfleet_router.routing.hashing import rendezvous_rank
from trtfleet_router.routing.placement import PlacementPlan

if TYPE_CHECKING:
    from tests.unit.router.routing.conftest import Harness

SUBJECT = 5


@dataclass(frozen=True)
class Case:
    id: str
    host_only: tuple[int, ...] = ()  # ranks where the subject is in the host tier but not on the device tier
    on_device: tuple[int, ...] = ()  # ranks where it is on both tiers
    loads: dict[int, int] = field(default_factory=dict)  # rank -> base-model requests in flight
    planned: tuple[int, ...] = ()  # ranks where the placement plans a host copy
    ttft_cost: tuple[int, str] = (0, "")  # (rank, reason) ttft-cost chooses
    tiered_cost: tuple[int, str] = (0, "")


CASES = [
    # equal queues: the copy it saves sends it to the pod whose GPU holds it (ttft-cost: the HRW order)
    Case("device-tier-breaks-the-tie", host_only=(0,), on_device=(1,), ttft_cost=(0, "warm"),
         tiered_cost=(1, "warm")),
    # a host copy with one request ahead (5.17 ms) beats a transfer to an idle pod (11.9 ms) for both
    Case("host-copy-beats-a-transfer", host_only=(1,), loads={1: 1}, ttft_cost=(1, "warm"), tiered_cost=(1, "warm")),
    # held nowhere, its home has 2 requests ahead (10 ms): one after the other that is 21.7 ms and ttft-cost spills
    # to an idle pod; overlapped it is max(11.7, 10) ms, so the weights go home while the queue drains
    Case("transfer-overlaps-the-queue", loads={0: 2}, ttft_cost=(1, "spill"), tiered_cost=(0, "cold-home")),
    # held nowhere, its home busy (3 ahead: 15 ms): the planned pod (rank 3) takes it, not the first idle one
    Case("cold-load-goes-where-the-plan-keeps-it", loads={0: 3}, planned=(3,), ttft_cost=(1, "spill"),
         tiered_cost=(3, "cold-planned")),
]


def setup(h: Harness, case: Case) -> list[str]:
    subject = h.adapter(SUBJECT)
    ranking = list(rendezvous_rank(subject.name, h.pod_ids))
    for rank in (*case.host_only, *case.on_device):
        h.make_warm(ranking[rank], subject)
    for rank in case.host_only:  # four other adapters push it off the 4-page device tier (8 host pages keep it)
        for other in range(4):
            h.make_warm(ranking[rank], h.adapter(100 + other))
    for rank, count in case.loads.items():
        h.load(ranking[rank], count)
    if case.planned:
        h.fleet.placer.plan = PlacementPlan(host={subject.task_id: tuple(ranking[r] for r in case.planned)}, device={})
    return ranking


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
@pytest.mark.parametrize("policy", ["ttft-cost", "tiered-cost"])
def test_tiered_cost(make_harness: Callable[..., Harness], case: Case, policy: str) -> None:
    h = make_harness(policy, pods=4)
    ranking = setup(h, case)
    residency = h.fleet.residency
    subject = h.adapter(SUBJECT)
    for rank in case.host_only:
        assert residency.pod(ranking[rank]).holds(subject.task_id)
        assert not residency.pod(ranking[rank]).on_device(subject.task_id)
    for rank in case.on_device:
        assert residency.pod(ranking[rank]).on_device(subject.task_id)
    rank, reason = case.tiered_cost if policy == "tiered-cost" else case.ttft_cost
    decision = h.route(subject)
    assert (ranking.index(decision.pod), decision.reason) == (rank, reason)
