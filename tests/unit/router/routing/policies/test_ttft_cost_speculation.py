"""The routing step model with speculative decoding: a pod whose requests get several tokens a step (its scraped
tokens per step) clears its in-flight requests in fewer steps, so each costs a new request less."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pytest
from trtfleet_router.routing import PodMetrics

from tests.unit.router.routing.policies.test_ttft_cost import prompt_request

if TYPE_CHECKING:
    from tests.unit.router.routing.conftest import Harness


@dataclass(frozen=True)
class Case:
    id: str
    loads: tuple[int, int]
    tokens_per_step: tuple[float | None, float | None]
    expected: str


CASES = [
    Case("no-speculation-fewer-in-flight-wins", (10, 6), (None, None), "p1"),
    # 10 x 5 ms / 3 = 16.7 ms of queue on p0 against 6 x 5 ms = 30 ms on p1
    Case("speculating-pod-clears-its-queue-faster", (10, 6), (3.0, None), "p0"),
    # 10 x 5 ms / 1.5 = 33 ms: not enough to beat p1
    Case("low-acceptance-is-not-enough", (10, 6), (1.5, None), "p1"),
    # a reading below 1 (no drafts) never makes a pod look busier than its requests
    Case("below-one-counts-as-one", (6, 7), (0.5, None), "p0"),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_tokens_per_step_divides_the_in_flight_delay(make_harness: Callable[..., Harness], case: Case) -> None:
    h = make_harness("ttft-cost", pods=2)
    for pod, load, tps in zip(("p0", "p1"), case.loads, case.tokens_per_step, strict=True):
        h.fleet.observe_metrics(pod, PodMetrics(load, 0, tokens_per_step=tps))
        h.load(pod, load)
    assert h.fleet.route(prompt_request(None, tokens=16)).pod == case.expected
