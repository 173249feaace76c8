"""Least-valuable scale-down (pure): each serving pod's deletion cost is the warm demand the routers see
on it."""

from __future__ import annotations

from typing import Any

import pytest
from trtfleet_operator.reconcile.deletioncost import DELETION_COST, deletion_cost_patches


def _pod(name: str, cost: str | None = None, *, deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if cost is not None:
        meta["annotations"] = {DELETION_COST: cost}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T12:00:00Z"
    return {"metadata": meta}


@pytest.mark.parametrize(
    ("pods", "warm", "want"),
    [
        pytest.param([_pod("hot"), _pod("cold")], {"hot": 120.0, "cold": 3.4}, [("hot", "120"), ("cold", "3")],
                     id="demand-becomes-the-cost"),
        pytest.param([_pod("new")], {}, [("new", "0")], id="unknown-to-the-routers-costs-nothing"),
        pytest.param([_pod("same", "7")], {"same": 7.2}, [], id="unchanged-not-patched"),
        pytest.param([_pod("gone", deleting=True)], {"gone": 9.0}, [], id="terminating-left-alone"),
        pytest.param([_pod("huge")], {"huge": 1e12}, [("huge", str(2**31 - 1))], id="clamped-to-int32"),
        pytest.param([_pod("nan")], {"nan": float("nan")}, [("nan", "0")], id="nan-is-zero"),
    ],
)
def test_deletion_cost_patches(pods: list[dict[str, Any]], warm: dict[str, float], want: list[tuple[str, str]]) -> None:
    assert deletion_cost_patches(pods, warm) == want
