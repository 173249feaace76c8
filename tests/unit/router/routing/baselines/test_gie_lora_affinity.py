"""gie-lora-affinity: queue 2 + KV 2 + LoRA affinity 1 (1.0 active, 0.8 free slot, 0 none); max score."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import pytest
from trtfleet_router.routing import PodMetrics

if TYPE_CHECKING:
    from tests.unit.router.routing.conftest import Harness

EQUAL = {"p0": 1, "p1": 1, "p2": 1}

CASES = [
    # (id, adapters pinned (in flight) per pod, adapters idle-resident per pod, in-flight per pod,
    #  scraped KV-cache use per pod, expected pods for adapter 1)
    ("active-adapter-wins", {"p2": [1]}, {}, EQUAL, {}, {"p2"}),
    # GIE sees only active adapters: idle residency on p1 is invisible, its longer queue loses.
    ("idle-resident-is-absent", {}, {"p1": [1]}, {"p0": 1, "p1": 2, "p2": 1}, {}, {"p0", "p2"}),
    # p0's two pages are pinned by adapters 2 and 3: no free slot (0) -> avoided.
    ("no-free-slot-avoided", {"p0": [2, 3]}, {}, {"p0": 2, "p1": 2, "p2": 2}, {}, {"p1", "p2"}),
    # queue (weight 2) outweighs affinity (weight 1): active on a longer queue loses.
    ("queue-beats-affinity", {"p2": [1]}, {}, {"p0": 1, "p1": 1, "p2": 2}, {}, {"p0", "p1"}),
    # KV use 0.9 on p0 scores 0.1, 0.2 on p1 scores 0.8, unknown on p2 scores 0.5.
    ("kv-cache-use", {}, {}, EQUAL, {"p0": 0.9, "p1": 0.2}, {"p1"}),
]


@pytest.mark.parametrize(("pinned", "idle", "inflight", "kv_used", "expected"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_gie_lora_affinity(
    make_harness: Callable[..., Harness],
    pinned: dict[str, list[int]],
    idle: dict[str, list[int]],
    inflight: dict[str, int],
    kv_used: dict[str, float],
    expected: set[str],
) -> None:
    h = make_harness("gie-lora-affinity", pods=3, host_pages=2)
    for pod, adapters in idle.items():
        for index in adapters:
            h.make_warm(pod, h.adapter(index))
    for pod, adapters in pinned.items():
        for index in adapters:
            h.pin(pod, h.adapter(index))
    for pod, count in inflight.items():
        h.load(pod, count - len(pinned.get(pod, [])))
    for pod, used in kv_used.items():
        h.fleet.observe_metrics(pod, PodMetrics(1, 0, kv_cache_used_fraction=used))
    chosen = set()
    for seed in range(12):  # ties are random: every outcome must be expected
        h.rng.seed(seed)
        decision = h.route(h.adapter(1))
        chosen.add(decision.pod)
        assert decision.send_weights is not h.fleet.is_warm(decision.pod, h.adapter(1).task_id)
    assert chosen <= expected
