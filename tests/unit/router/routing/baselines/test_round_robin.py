"""round-robin: rotation over the candidates; weights exactly when the shadow says cold."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tests.unit.router.routing.conftest import Harness

CASES = [
    # (id, pods warm with adapter 1 before, excluded pods, expected (pod, send_weights) for 5 requests)
    ("rotates-and-loads-everywhere", [], [], [("p0", True), ("p1", True), ("p2", True), ("p0", False),
                                              ("p1", False)]),
    ("ignores-residency", ["p2"], [], [("p0", True), ("p1", True), ("p2", False), ("p0", False),
                                       ("p1", False)]),
    ("skips-excluded", [], ["p1"], [("p0", True), ("p2", True), ("p0", False), ("p2", False),
                                    ("p0", False)]),
]


@pytest.mark.parametrize(
    ("warm_on", "exclude", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_round_robin(
    make_harness: Callable[..., Harness], warm_on: list[str], exclude: list[str],
    expected: list[tuple[str, bool]],
) -> None:
    h = make_harness("round-robin", pods=3)
    adapter = h.adapter(1)
    for pod in warm_on:
        h.make_warm(pod, adapter)
    got = []
    for _ in expected:
        decision = h.run(adapter, exclude=exclude)
        got.append((decision.pod, decision.send_weights))
        assert decision.policy == "round-robin"
        assert decision.warm is not decision.send_weights
    assert got == expected
