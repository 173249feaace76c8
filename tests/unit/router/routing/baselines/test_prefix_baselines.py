"""The prefix baselines, one table each: llm-d's default profile, KubeAI's PrefixHash, Dynamo's KV cost.

Every case: a 64-block (2,048-token) prompt for adapter 1; ``prefix`` pods served its first N blocks before;
``loads`` base-model requests in flight. Pods are p0..p3.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pytest
from trtfleet_router.routing import AdapterRef, Decision, Outcome, PodMetrics, RouteRequest
from trtfleet_router.routing.prefix import PromptBlocks, token_block_hashes

from tests.unit.router.routing.baselines.test_chwbl import ring_order

if TYPE_CHECKING:
    from tests.unit.router.routing.conftest import Harness

TOKENS = 2048


def request(adapter: AdapterRef, blocks: int = TOKENS // 32) -> RouteRequest:
    hashes = token_block_hashes(list(range(TOKENS)), adapter.task_id, 32)
    return RouteRequest("m", adapter, TOKENS, 16, blocks=PromptBlocks(hashes.hashes[:blocks], 32, True))


@dataclass(frozen=True)
class Case:
    id: str
    prefix: dict[str, int] = field(default_factory=dict)  # pod -> leading blocks it served
    loads: dict[str, int] = field(default_factory=dict)
    kv_used: dict[str, float] = field(default_factory=dict)  # scraped KV-cache use
    expected: str = "p0"


def prepare(h: Harness, case: Case, adapter: AdapterRef) -> None:
    for pod, blocks in case.prefix.items():
        h.fleet.finish(h.fleet.start(Decision(pod, True, False, "test", "setup"), request(adapter, blocks)), Outcome.OK)
    for pod, count in case.loads.items():
        h.load(pod, count)
    for pod, used in case.kv_used.items():
        h.fleet.observe_metrics(pod, PodMetrics(0, 0, used))


LLMD_CASES = [
    # prefix 3 x share, queue 2 x min-max inverse, KV 2 x (1 - used) (0.5 unknown)
    Case("whole-prefix-beats-idle", prefix={"p2": 64}, loads={"p2": 1}, expected="p2"),
    # p2 holds a quarter (3 x 0.25) but has the longest queue (0) and unknown KV use (2 x 0.5): 1.75;
    # p0 has an empty queue (2) and an empty KV cache (2): 4
    Case("small-prefix-loses-to-load", prefix={"p2": 16}, loads={"p2": 2, "p0": 1, "p1": 1, "p3": 1},
         expected="p0", kv_used={"p0": 0.0, "p1": 0.5, "p3": 0.5}),
    Case("kv-use-breaks-ties", kv_used={"p0": 0.9, "p1": 0.9, "p2": 0.1, "p3": 0.9}, expected="p2"),
]


@pytest.mark.parametrize("case", LLMD_CASES, ids=[c.id for c in LLMD_CASES])
def test_llmd_default(make_harness: Callable[..., Harness], case: Case) -> None:
    h = make_harness("llmd-default", pods=4)
    adapter = h.adapter(1)
    prepare(h, case, adapter)
    assert h.fleet.route(request(adapter)).pod == case.expected


DYNAMO_CASES = [
    # logit = (64 - overlap) + load x 64
    Case("overlap-wins-when-idle", prefix={"p3": 48}, expected="p3"),
    # p3: 16 + 64 = 80 > 64 for an idle pod without the prefix
    Case("one-active-request-outweighs-48-blocks", prefix={"p3": 48}, loads={"p3": 1, "p0": 1, "p1": 1},
         expected="p2"),
]


@pytest.mark.parametrize("case", DYNAMO_CASES, ids=[c.id for c in DYNAMO_CASES])
def test_dynamo_kv(make_harness: Callable[..., Harness], case: Case) -> None:
    h = make_harness("dynamo-kv", pods=4)
    adapter = h.adapter(1)
    prepare(h, case, adapter)
    assert h.fleet.route(request(adapter)).pod == case.expected


def test_kubeai_prefix_hash_keys_on_adapter_and_first_block(make_harness: Callable[..., Harness]) -> None:
    h = make_harness("kubeai-prefix-hash", pods=4)
    adapter = h.adapter(1)
    first = request(adapter).blocks.hashes[0]
    assert h.fleet.route(request(adapter)).pod == ring_order(f"{adapter.name}/{first:016x}", h.pod_ids)[0]
    assert h.fleet.route(request(adapter, blocks=0)).pod == ring_order(adapter.name, h.pod_ids)[0]
