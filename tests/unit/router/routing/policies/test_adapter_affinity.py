"""adapter-affinity (adapter residency only): warm first; cold loads by rendezvous hashing within the load
bound, priced, never where nothing is evictable; rare adapters confined to the churn pods; hot adapters spread."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest
from trtfleet_router.routing import CachesBusy, NoCapacity, Outcome
from trtfleet_router.routing.hashing import rendezvous_rank
from trtfleet_router.routing.policies.cold_placement import CHURN_KEY

if TYPE_CHECKING:
    from tests.unit.router.routing.conftest import Harness

SUBJECT = 1  # the adapter every case routes; positions below are ranks in its HRW order
GIB = 1024  # in MiB

# Steps: ("warm", rank, adapter, requests) idle-resident after that many requests there;
# ("pin", rank, adapter) resident and in flight; ("load", rank, base-model requests in flight);
# ("cache_full", rank) the pod answered "cache full" just now.
CASES: list[tuple[str, list[tuple[Any, ...]], dict[str, Any], int | None, bool, str]] = [
    # (id, steps, subject options, expected rank (None: NoCapacity), send_weights, reason)
    ("warm-idle", [("warm", 2, SUBJECT, 1)], {}, 2, False, "warm"),
    ("cold-goes-home", [], {}, 0, True, "cold-home"),
    ("warm-within-bound", [("warm", 2, SUBJECT, 1), ("load", 2, 12)], {}, 2, False, "warm"),
    ("warm-over-bound-leaves", [("warm", 2, SUBJECT, 1), ("load", 2, 13)], {}, 0, True, "warm-overloaded"),
    # 2 GiB at 1.25 GB/s = 1.7 s > 13 x 0.05 s of queueing: stays.
    ("warm-over-bound-stays-when-transfer-dearer", [("warm", 2, SUBJECT, 1), ("load", 2, 13)],
     {"weights_mib": 2 * GIB}, 2, False, "warm-over-bound"),
    ("home-over-bound-skipped", [("load", 0, 13)], {}, 1, True, "cold-home"),
    ("home-with-nothing-evictable-skipped", [("pin", 0, 2), ("pin", 0, 3), ("pin", 0, 4), ("pin", 0, 5)], {},
     1, True, "cold-home"),
    ("home-in-cache-full-backoff-skipped", [("cache_full", 0)], {}, 1, True, "cold-home"),
    ("everything-busy-no-capacity", [("pin", r, 10 + 4 * r + k) for r in range(4) for k in range(4)], {},
     None, True, ""),
    ("not-hot-stays", [("pin", 0, SUBJECT)] * 3, {}, 0, False, "warm"),
    ("hot-spreads-to-next-ranked", [("pin", 0, SUBJECT)] * 4, {}, 1, True, "hot-spread"),
    ("rare-victims-evicted-at-home", [("warm", 0, 20 + k, 1) for k in range(4)], {}, 0, True, "cold-home"),
    ("over-bound-everywhere-least-loaded-that-fits",
     # rank 3 is least loaded (4 pinned: bound 16) but cannot store it; the others are over the bound
     [("load", 0, 17), ("load", 1, 18), ("load", 2, 19), ("pin", 3, 2), ("pin", 3, 3), ("pin", 3, 4),
      ("pin", 3, 5)], {}, 0, True, "cold-over-bound"),
]


def setup(h: Harness, ranking: tuple[str, ...], steps: list[tuple[Any, ...]]) -> None:
    for step in steps:
        action, rank = step[0], step[1]
        pod = ranking[rank]
        if action == "warm":
            for _ in range(step[3]):
                h.make_warm(pod, h.adapter(step[2]))
        elif action == "pin":
            h.pin(pod, h.adapter(step[2]))
        elif action == "load":
            h.load(pod, step[2])
        elif action == "cache_full":
            h.finish(h.force(pod, h.adapter(99)), Outcome.CACHE_FULL)
        else:
            raise AssertionError(action)


@pytest.mark.parametrize(("steps", "options", "expected", "send_weights", "reason"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_trtfleet(
    make_harness: Callable[..., Harness],
    steps: list[tuple[Any, ...]],
    options: dict[str, Any],
    expected: int | None,
    send_weights: bool,
    reason: str,
) -> None:
    h = make_harness("adapter-affinity", pods=4, host_pages=4)
    subject = h.adapter(SUBJECT, **options)
    ranking = rendezvous_rank(subject.name, h.pod_ids)
    setup(h, ranking, steps)
    if expected is None:
        with pytest.raises(CachesBusy) as caught:  # the shell waits for a request to end
            h.route(subject)
        assert isinstance(caught.value, NoCapacity) and caught.value.retry_after_s > 0
        return
    decision = h.route(subject)
    got = (ranking.index(decision.pod), decision.send_weights, decision.reason)
    assert got == (expected, send_weights, reason)
    assert decision.warm is not decision.send_weights


@pytest.mark.parametrize(("overhead_s", "expected"), [(0.0, 0), (1.0, 2)])
def test_leaving_an_overloaded_warm_pod_pays_the_loads_fixed_cost(
    make_harness: Callable[..., Harness], overhead_s: float, expected: int
) -> None:
    """13 requests ahead on the warm pod cost 0.65 s; an 8 MiB load 6.7 ms plus its fixed part."""
    h = make_harness("adapter-affinity", pods=4, host_pages=4,
                     config={"adapter_affinity": {"loadOverheadS": overhead_s}})
    subject = h.adapter(SUBJECT)
    ranking = rendezvous_rank(subject.name, h.pod_ids)
    setup(h, ranking, [("warm", 2, SUBJECT, 1), ("load", 2, 13)])
    assert ranking.index(h.route(subject).pod) == expected


def test_rare_adapter_goes_to_a_churn_pod_not_over_popular_ones(make_harness: Callable[..., Harness]) -> None:
    h = make_harness("adapter-affinity", pods=8, host_pages=4)  # churn pods: 2 of 8
    churn = set(rendezvous_rank(CHURN_KEY, h.pod_ids)[:2])
    # an adapter whose two home pods are not churn pods
    subject = next(a for a in (h.adapter(i) for i in range(100, 200))
                   if not churn & set(rendezvous_rank(a.name, h.pod_ids)[:2]))
    ranking = rendezvous_rank(subject.name, h.pod_ids)
    for rank in (0, 1):  # the home pods hold 4 popular (3 requests each) idle adapters
        for k in range(4):
            for _ in range(3):
                h.make_warm(ranking[rank], h.adapter(300 + 10 * rank + k))
    decision = h.route(subject)
    assert decision.reason == "cold-churn"
    assert decision.pod == next(pod for pod in ranking if pod in churn)
    # once it is as popular as they are, it may evict them at home
    for _ in range(3):
        h.run(subject)
    h.fleet.finish(h.fleet.start(h.fleet.prewarm_decision(decision.pod), h.request(subject)), Outcome.MISS)
    again = h.route(subject)
    assert (again.pod, again.reason) == (ranking[0], "cold-home")


def test_base_model_requests_go_to_the_least_loaded(make_harness: Callable[..., Harness]) -> None:
    h = make_harness("adapter-affinity", pods=4)
    for pod, count in (("p0", 2), ("p1", 1), ("p2", 3), ("p3", 1)):
        h.load(pod, count)
    decisions = {h.route(None).pod for _ in range(10)}
    assert decisions <= {"p1", "p3"}
    assert all(not h.route(None).send_weights for _ in range(3))


def test_cache_full_backoff_expires(make_harness: Callable[..., Harness]) -> None:
    h = make_harness("adapter-affinity", pods=3, config={"cacheFullBackoffS": 2.0})
    subject = h.adapter(SUBJECT)
    ranking = rendezvous_rank(subject.name, h.pod_ids)
    setup(h, ranking, [("cache_full", 0)])
    assert h.route(subject).pod == ranking[1]
    h.now_s += 2.01
    assert h.route(subject).pod == ranking[0]


def test_excluded_home_is_skipped(make_harness: Callable[..., Harness]) -> None:
    h = make_harness("adapter-affinity", pods=3)
    subject = h.adapter(SUBJECT)
    ranking = rendezvous_rank(subject.name, h.pod_ids)
    h.make_warm(ranking[0], subject)
    decision = h.route(subject, exclude=[ranking[0]])
    assert (decision.pod, decision.send_weights) == (ranking[1], True)


def test_settled_pods_before_pods_still_loading(make_harness: Callable[..., Harness]) -> None:
    h = make_harness("adapter-affinity", pods=4)
    subject = h.adapter(SUBJECT)
    ranking = rendezvous_rank(subject.name, h.pod_ids)
    h.make_warm(ranking[2], subject)
    h.load(ranking[2], 3)
    h.pin(ranking[1], subject, admitted=False)  # weights in transit to ranking[1], which is less loaded
    decision = h.route(subject)
    assert (decision.pod, decision.loading) == (ranking[2], False)
    h.load(ranking[2], 10)  # settled pod over the bound (min load 0 + 12): the loading one is next
    decision = h.route(subject)
    assert (decision.pod, decision.send_weights, decision.loading) == (ranking[1], False, True)


def test_no_hot_spread_while_a_load_is_in_transit(make_harness: Callable[..., Harness]) -> None:
    h = make_harness("adapter-affinity", pods=4)
    subject = h.adapter(SUBJECT)
    ranking = rendezvous_rank(subject.name, h.pod_ids)
    loading = h.pin(ranking[0], subject, admitted=False)
    for _ in range(7):
        h.pin(ranking[0], subject)
    assert h.route(subject).reason == "warm"
    h.fleet.confirm(loading)
    assert (h.route(subject).pod, h.route(subject).reason) == (ranking[1], "hot-spread")


def test_a_suspect_copy_on_a_full_pod_still_takes_its_weights_again(make_harness: Callable[..., Harness]) -> None:
    h = make_harness("adapter-affinity", pods=2, host_pages=2)
    subject = h.adapter(SUBJECT)
    home = rendezvous_rank(subject.name, h.pod_ids)[0]
    h.pin(home, subject)
    h.pin(home, h.adapter(2))  # home full of busy adapters, the subject among them
    h.run(subject, Outcome.MISS)  # the pod lost it: suspect while our request pins it
    decision = h.route(subject)
    assert (decision.pod, decision.send_weights, decision.reason) == (home, True, "cold-home")
