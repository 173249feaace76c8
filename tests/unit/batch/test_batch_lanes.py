"""Lines taken a model at a time on up to ``lanes`` models at once (pure)."""

from __future__ import annotations

import pytest

from trtfleet.batch.lanes import LineLanes
from trtfleet.batch.lines import BatchLine, order_by_model


def _lines(models: str) -> list[BatchLine]:
    """One line per character: its model is the character, its custom_id ``<model><index>``."""
    return [BatchLine(i + 1, f"{m}{i}", m, {}) for i, m in enumerate(models)]


def _ids(lines: list[BatchLine]) -> list[str]:
    return [item.custom_id for item in lines]


def test_one_lane_is_the_order_given() -> None:
    lanes = LineLanes(_lines("abab"))  # input order: four runs of one line
    assert _ids([lanes.take() for _ in range(4)]) == ["a0", "b1", "a2", "b3"]
    assert not lanes and len(lanes) == 0
    with pytest.raises(IndexError):
        lanes.peek()


def test_lanes_start_the_group_with_the_fewest_lines_in_flight() -> None:
    lanes = LineLanes(order_by_model(_lines("aaabbbc")))
    taken = [lanes.take(2) for _ in range(4)]
    assert _ids(taken) == ["a0", "b3", "a1", "b4"]  # two groups at once, alternating
    lanes.done(taken[0])
    lanes.done(taken[2])  # a has nothing in flight now, b two lines
    assert lanes.take(2).custom_id == "a2"  # the group with fewer in flight; a is now used up
    assert lanes.peek(2).custom_id == "c6"  # b and c active: b has two in flight, c none
    lanes.done(taken[1])
    lanes.done(taken[3])
    assert _ids([lanes.take(2), lanes.take(2)]) == ["b5", "c6"]  # a tie goes to the earlier group
    assert not lanes


def test_a_finished_group_hands_its_lane_to_the_next() -> None:
    lanes = LineLanes(order_by_model(_lines("abbc")))
    first = lanes.take(2)
    assert first.custom_id == "a0"
    second = lanes.take(2)
    assert second.custom_id == "b1"  # a is used up: b and c are the two lanes now
    assert lanes.take(2).custom_id == "c3"  # c has none in flight, b has one
    assert len(lanes) == 1
