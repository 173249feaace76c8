"""least-load: fewest in-flight (+ scraped waiting while fresh), ties at random."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import pytest
from trtfleet_router.routing import PodMetrics

if TYPE_CHECKING:
    from tests.unit.router.routing.conftest import Harness

STALE_AFTER_S = 5.0

CASES = [
    # (id, in-flight per pod, scraped waiting per pod, scrape age s, expected pods)
    ("fewest-in-flight", {"p0": 3, "p1": 1, "p2": 2}, {}, 0.0, {"p1"}),
    ("fresh-waiting-counts", {"p0": 3, "p1": 1, "p2": 2}, {"p1": 5}, 1.0, {"p2"}),
    ("stale-waiting-is-unknown", {"p0": 3, "p1": 1, "p2": 2}, {"p1": 5}, STALE_AFTER_S + 0.1, {"p1"}),
    ("tie-is-either", {"p0": 2, "p1": 1, "p2": 1}, {}, 0.0, {"p1", "p2"}),
]


@pytest.mark.parametrize(("inflight", "waiting", "age_s", "expected"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_least_load(
    make_harness: Callable[..., Harness], inflight: dict[str, int], waiting: dict[str, int], age_s: float,
    expected: set[str],
) -> None:
    h = make_harness("least-load", pods=3, config={"metricsStaleAfterS": STALE_AFTER_S})
    for pod, count in inflight.items():
        h.load(pod, count)
    for pod, queued in waiting.items():
        h.fleet.observe_metrics(pod, PodMetrics(active_requests=8, waiting_requests=queued))
    h.now_s += age_s
    for adapter in (None, h.adapter(1)):
        decision = h.route(adapter)
        assert decision.pod in expected
        assert decision.send_weights is (adapter is not None)


def test_ties_are_broken_by_the_injected_rng(make_harness: Callable[..., Harness]) -> None:
    chosen = {make_harness("least-load", pods=4, seed=seed).route(None).pod for seed in range(40)}
    assert chosen == {"p0", "p1", "p2", "p3"}
    same = {make_harness("least-load", pods=4, seed=7).route(None).pod for _ in range(5)}
    assert len(same) == 1
