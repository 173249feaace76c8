"""chwbl: ring of 256 points per pod keyed by adapter name; first pod with in-flight + 1 <= 1.25 x mean."""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import pytest
from trtfleet_router.routing.hashing import stable_hash64

if TYPE_CHECKING:
    from tests.unit.router.routing.conftest import Harness


def ring_order(key: str, pods: Sequence[str], virtual_nodes: int = 256) -> list[str]:
    """Pods in the order a clockwise walk from ``key`` meets them (an independent re-derivation)."""
    ring = sorted((stable_hash64(f"{pod}{i}"), pod) for pod in pods for i in range(virtual_nodes))
    start = bisect.bisect_left([point for point, _ in ring], stable_hash64(key)) % len(ring)
    order: list[str] = []
    for step in range(len(ring)):
        pod = ring[(start + step) % len(ring)][1]
        if pod not in order:
            order.append(pod)
    return order


CASES = [
    # (id, in-flight by ring position, excluded ring positions, expected ring position)
    ("idle-fleet-takes-the-first", {}, [], 0),
    # total 3, 4 pods: threshold 1.25 x 4 / 4 = 1.25; first has 3 + 1 > 1.25.
    ("first-over-bound", {0: 3}, [], 1),
    # total 4: threshold 1.25 x 5 / 4 = 1.5625; 2 + 1 > 1.56 for the first two.
    ("first-two-over-bound", {0: 2, 1: 2}, [], 2),
    # total 8: threshold 2.81, everyone at 2 + 1 = 3 > 2.81: KubeAI's default, the first on the ring.
    ("none-acceptable-falls-back-to-first", {0: 2, 1: 2, 2: 2, 3: 2}, [], 0),
    ("excluded-skipped", {}, [0], 1),
]


@pytest.mark.parametrize(
    ("inflight", "excluded", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_chwbl(
    make_harness: Callable[..., Harness], inflight: dict[int, int], excluded: list[int], expected: int
) -> None:
    h = make_harness("chwbl", pods=4)
    adapter = h.adapter(7)
    order = ring_order(adapter.name, h.pod_ids)
    for position, count in inflight.items():
        h.load(order[position], count)
    decision = h.route(adapter, exclude=[order[i] for i in excluded])
    assert decision.pod == order[expected]
    assert decision.send_weights


def test_same_adapter_same_pod_and_base_model_hashes_the_empty_key(
    make_harness: Callable[..., Harness],
) -> None:
    h = make_harness("chwbl", pods=5)
    adapter = h.adapter(3)
    assert {h.run(adapter).pod for _ in range(5)} == {ring_order(adapter.name, h.pod_ids)[0]}
    assert h.route(None).pod == ring_order("", h.pod_ids)[0]
