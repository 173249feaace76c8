"""dynamo-hrw: Dynamo's proportional replica counts over device slots, sticky HRW sets, the replica-set filter."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import pytest
from trtfleet_router.routing.baselines.dynamo_hrw import replica_counts
from trtfleet_router.routing.hashing import rendezvous_rank

if TYPE_CHECKING:
    from tests.unit.router.routing.conftest import Harness

COUNTS = [
    # (id, loads, total slots, workers, expected)
    ("proportional", (("a", 10), ("b", 10)), 8, 4, {"a": 4, "b": 4}),
    # ceil(3.87) + ceil(0.13) = 5 > 4 slots: x 0.8 -> 3.1 and at least 1
    ("at-least-one", (("a", 30), ("b", 1)), 4, 4, {"a": 3, "b": 1}),
    ("at-most-the-workers", (("a", 1),), 16, 4, {"a": 4}),
    # more active adapters than slots: the most loaded ones (ties by name) get one each
    ("only-the-top-slots", (("c", 1), ("a", 1), ("b", 1)), 2, 4, {"a": 1, "b": 1}),
    # ceil(2), ceil(1.2), ceil(0.8) = 5 > 4 slots: x 0.8 -> 1.6, 1.6, 1 -> floors 1, 1, 1, the leftover slot to the
    # largest remainder (a and b tie at 0.6: a by name)
    ("largest-remainder", (("a", 5), ("b", 3), ("c", 2)), 4, 4, {"a": 2, "b": 1, "c": 1}),
    ("no-slots", (("a", 5),), 0, 4, {}),
]


@pytest.mark.parametrize(
    ("loads", "slots", "workers", "expected"), [c[1:] for c in COUNTS], ids=[c[0] for c in COUNTS]
)
def test_replica_counts(
    loads: tuple[tuple[str, int], ...], slots: int, workers: int, expected: dict[str, int]
) -> None:
    assert replica_counts(loads, slots, workers) == expected


def test_requests_stay_in_the_replica_set_where_the_adapter_is_loaded(make_harness: Callable[..., Harness]) -> None:
    # 4 pods x 4 device pages: one active adapter's set is every pod; it is loaded on the one it went to first,
    # and the filter keeps it there even when that pod is the busiest (Dynamo's "loaded workers in the set")
    h = make_harness("dynamo-hrw", pods=4)
    adapter = h.adapter(3)
    first = h.run(adapter)
    assert first.send_weights and first.reason == "replica-set"
    h.load(first.pod, 3)
    again = h.route(adapter)
    assert again.pod == first.pod and again.warm and again.reason == "replica-loaded"


def test_inactive_adapters_keep_one_hrw_pin(make_harness: Callable[..., Harness]) -> None:
    h = make_harness("dynamo-hrw", pods=4, config={"dynamoHrw": {"timestepS": 1.0, "rateWindowMultiplier": 5}})
    quiet, busy = h.adapter(1), h.adapter(2)
    h.run(quiet)
    h.now_s += 30.0  # the window (5 s) forgets it; its smoothed load decays below 1 after a few ticks
    for _ in range(8):
        h.run(busy)
        h.now_s += 1.0
    decision = h.route(quiet)
    assert decision.reason == "pin"
    assert decision.pod == rendezvous_rank(quiet.name, h.pod_ids)[0]
