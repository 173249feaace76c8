"""Status conditions: transition times move only when the status does."""

from __future__ import annotations

from trtfleet_operator import conditions as cond


def test_condition_transition_time_moves_only_on_status_change() -> None:
    first = cond.merge(None, [cond.make("Ready", "False", "RollingOut", "x")], now="T1")
    same = cond.merge(first, [cond.make("Ready", "False", "ReplicasUnavailable", "y")], now="T2")
    flipped = cond.merge(same, [cond.make("Ready", "True", "RolloutComplete")], now="T3")
    assert [c["lastTransitionTime"] for c in (*first, *same, *flipped)] == ["T1", "T1", "T3"]
    ordered = cond.merge(None, [cond.make("Ready", "True", "A"), cond.make("EngineBuilt", "True", "B")], now="T")
    assert [c["type"] for c in ordered] == ["EngineBuilt", "Ready"]
