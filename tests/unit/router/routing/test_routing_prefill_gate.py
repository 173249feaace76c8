"""The batch lane's prefill gate on a real fleet's books: an interactive prompt still waiting for its first
answer holds batch lines back from its pod (``pod``), from every pod (``fleet``) or not at all (``off``)
(``upstream/priority.py``)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from trtfleet_router.upstream.priority import PrefillGate, batch_admits, batch_may_start, interactive_prefilling

from tests.unit.router.routing.conftest import Harness

SLOTS = 6


@pytest.mark.parametrize(
    ("gate", "on_its_pod", "elsewhere"),
    [
        pytest.param(PrefillGate.POD, False, True, id="pod"),
        pytest.param(PrefillGate.FLEET, False, False, id="fleet"),
        pytest.param(PrefillGate.OFF, True, True, id="off"),
    ],
)
def test_an_interactive_prefill_holds_batch_lines_until_its_first_answer(
    make_harness: Callable[..., Harness], gate: PrefillGate, on_its_pod: bool, elsewhere: bool
) -> None:
    h = make_harness("trtfleet", pods=3)
    other = "p2"
    assert batch_admits(h.fleet, "p1", SLOTS, 0, gate) and batch_admits(h.fleet, other, SLOTS, 0, gate)
    ticket = h.force("p1", h.adapter(1))  # an interactive request, its prompt booked on p1
    assert h.fleet.prefix_index.pending_prefill_tokens("p1") > 0
    assert batch_admits(h.fleet, "p1", SLOTS, 0, gate) is on_its_pod
    assert batch_admits(h.fleet, other, SLOTS, 0, gate) is elsewhere
    h.fleet.first_token(ticket)  # its first answer: the prefill is done, the request still decodes
    assert batch_admits(h.fleet, "p1", SLOTS, 0, gate) and batch_admits(h.fleet, other, SLOTS, 0, gate)


def test_a_batch_lines_prompt_holds_nothing(make_harness: Callable[..., Harness]) -> None:
    """Batch lines book no pending prefill (their first answer is their whole answer), so they never gate
    each other, under either scope."""
    h = make_harness("trtfleet", pods=2)
    h.force("p1", h.adapter(1), background=True)
    assert h.fleet.prefix_index.pending_prefill_tokens("p1") == 0
    assert batch_admits(h.fleet, "p1", SLOTS, 0, PrefillGate.FLEET)


def test_the_gate_adds_to_the_slot_and_waiting_rules() -> None:
    def pending(pod: str) -> int:
        return {"a": 0, "b": 12}[pod]

    assert not interactive_prefilling(PrefillGate.POD, "a", pending, ["a", "b"])
    assert interactive_prefilling(PrefillGate.POD, "b", pending, ["a", "b"])
    assert interactive_prefilling(PrefillGate.FLEET, "a", pending, ["a", "b"])
    assert not interactive_prefilling(PrefillGate.OFF, "b", pending, ["a", "b"])
    assert not batch_may_start(pod_load=0, pod_slots=SLOTS, interactive_waiting=0, prefilling=True)
    assert not batch_may_start(pod_load=SLOTS, pod_slots=SLOTS, interactive_waiting=0, prefilling=False)
    assert batch_may_start(pod_load=0, pod_slots=SLOTS, interactive_waiting=0, prefilling=False)
