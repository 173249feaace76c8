"""The BLS model's graveyard: items are handed back only once their hold time has passed."""

from __future__ import annotations

import threading

from trtfleet_engines.reference.graveyard import Graveyard, GraveyardSweeper


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


def test_items_come_due_in_burial_order_after_the_hold_time() -> None:
    clock = FakeClock()
    graveyard: Graveyard[str] = Graveyard(hold_s=2.0, clock=clock)
    assert graveyard.seconds_to_next() is None and graveyard.seconds_to_last() == 0.0
    graveyard.bury("a")
    clock.now_s += 1.0
    graveyard.bury("b")
    cases = [  # (seconds later, due now, still held)
        (0.0, [], 2),
        (0.75, [], 2),
        (0.25, ["a"], 1),
        (0.5, [], 1),
        (0.5, ["b"], 0),
    ]
    for later_s, due, held in cases:
        clock.now_s += later_s
        assert graveyard.due() == due
        assert len(graveyard) == held


def test_seconds_to_next_and_last() -> None:
    clock = FakeClock()
    graveyard: Graveyard[int] = Graveyard(hold_s=2.0, clock=clock)
    graveyard.bury(1)
    clock.now_s += 0.5
    graveyard.bury(2)
    assert graveyard.seconds_to_next() == 1.5 and graveyard.seconds_to_last() == 2.0
    clock.now_s += 3.0
    assert graveyard.seconds_to_next() == 0.0 and graveyard.seconds_to_last() == 0.0
    assert graveyard.drain() == [1, 2] and len(graveyard) == 0


def test_sweeper_drops_due_items_and_close_waits_at_most_its_cap() -> None:
    clock = FakeClock()
    waited: list[float] = []
    dropped = threading.Event()

    class Tracked:
        def __del__(self) -> None:
            dropped.set()

    sweeper: GraveyardSweeper[object] = GraveyardSweeper(Graveyard(hold_s=0.0), sleep=waited.append)
    sweeper.bury(Tracked())
    assert dropped.wait(10), "the sweeper thread never dropped a due item"
    held = GraveyardSweeper(Graveyard(hold_s=2.0, clock=clock), sleep=waited.append)
    held.bury(object())
    held.bury(object())
    assert held.close(max_wait_s=0.5) == 2
    assert waited == [0.5]
    assert sweeper.close() == 0
