"""trtfleet (default): queue + adapter cold cost + prefill of the uncached blocks, one decision in seconds.

Defaults priced here: 14.5 us per uncached prompt token, queued ahead or the request's own, 5 ms per
request in flight, an 8 MiB adapter's load costs 11.7 ms (5 ms fixed, ``loadOverheadS``, plus 6.7 ms over the
link; twice that when it evicts, once more for each load already on its way to the pod). The prompt is 8,192
tokens (256 blocks): 0.119 s of prefill where nothing is cached, 0 where the whole prefix is.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pytest
from trtfleet_router.routing import AdapterRef, Decision, Outcome, PodMetrics, RouteRequest
from trtfleet_router.routing.hashing import rendezvous_rank
from trtfleet_router.routing.prefix import token_block_hashes

if TYPE_CHECKING:
    from tests.unit.router.routing.conftest import Harness

PROMPT_TOKENS = 8192
SUBJECT = 1


def prompt_request(adapter: AdapterRef | None, tokens: int = PROMPT_TOKENS) -> RouteRequest:
    task_id = adapter.task_id if adapter is not None else 0
    blocks = token_block_hashes(list(range(tokens)), task_id, 32)
    return RouteRequest("m", adapter, tokens, 16, blocks=blocks)


@dataclass(frozen=True)
class Case:
    id: str
    warm: tuple[int, ...] = ()  # ranks where the subject is resident (idle)
    prefix: tuple[int, ...] = ()  # ranks that served the subject's prompt (its blocks are cached there)
    evicted: tuple[int, ...] = ()  # ranks whose LoRA cache then dropped the subject (4 other adapters)
    loads: dict[int, int] = field(default_factory=dict)  # rank -> base-model requests in flight
    pinned_loading: dict[int, int] = field(default_factory=dict)  # rank -> subject requests, weights in transit
    prefilling: dict[int, int] = field(default_factory=dict)  # rank -> 8,192-token prompts started, no first token
    weights_mib: int = 8
    expected_rank: int = 0
    send_weights: bool = False
    reason: str = "warm"


CASES = [
    Case("cold-goes-home", expected_rank=0, send_weights=True, reason="cold-home"),
    Case("warm-least-cost", warm=(2, 3), loads={2: 1}, expected_rank=3),
    # 2 x 5 ms of queue < 0.119 s of prefill saved: the conversation stays on its pod
    Case("conversation-stays-with-its-prefix", warm=(3,), prefix=(2,), loads={2: 2}, expected_rank=2,
         reason="warm-prefix"),
    # three short requests ahead are not a prefill: they cost 15 ms, far less than the prefix saves
    Case("short-requests-ahead-keep-the-prefix", warm=(3,), prefix=(2,), loads={2: 3}, expected_rank=2,
         reason="warm-prefix"),
    # an 8,192-token prompt prefilling ahead (0.119 s + 5 ms) costs more than the prefix saves: it spreads
    Case("hot-prefix-spreads", warm=(3,), prefix=(2,), prefilling={2: 1}, expected_rank=3),
    # 24 requests in flight (0.12 s) also outweigh it
    Case("busy-prefix-spreads", warm=(3,), prefix=(2,), loads={2: 24}, expected_rank=3),
    # the adapter left pod 1 but its blocks did not: a cold load (23 ms with the eviction) beats 0.119 s
    Case("cold-adapter-warm-prefix", warm=(2,), prefix=(1,), evicted=(1,), expected_rank=1, send_weights=True,
         reason="cold-prefix"),
    # a 2 GiB adapter costs 1.7 s (3.4 s evicting): prefill on the warm pod is cheaper
    Case("warm-adapter-cold-prefix-when-weights-dear", warm=(2,), prefix=(1,), evicted=(1,), weights_mib=2048,
         expected_rank=2),
    # four of the subject's requests in flight on one warm pod, weights still in transit: hot, and priced
    # spreading does not wait for that load to land (adapter-affinity would stay)
    Case("hot-adapter-spreads-while-loading", pinned_loading={0: 4}, expected_rank=1, send_weights=True,
         reason="hot-spread"),
    # not hot, but three transfers are queued on the pod's link: a request sent there waits for 4 x 11.7 ms;
    # the idle pod with the shortest queue takes it cold after one transfer (spill)
    Case("weights-queued-on-the-link-spill", pinned_loading={0: 3}, expected_rank=1, send_weights=True,
         reason="spill"),
    # one load on its way: 2 x 11.7 ms + 5 ms of queue there > 11.7 ms for a fresh load on an idle pod
    Case("loading-pod-priced-with-its-link", pinned_loading={0: 1}, expected_rank=1, send_weights=True,
         reason="spill"),
    # over the load bound (12 above the least loaded): the queue is dearer than a cold load at home
    # one 8,192-token prompt still prefilling on the only warm pod (0.119 s) > an 11.7 ms load: cold home
    Case("pending-prefill-spreads", warm=(2,), prefilling={2: 1}, expected_rank=0, send_weights=True,
         reason="hot-spread"),
    # the same prompt's first token came back: nothing pending, the warm pod again
    Case("prefill-done-stays", warm=(2,), prefilling={2: -1}, expected_rank=2),
    Case("queue-dominates-over-bound", warm=(2,), loads={2: 13}, expected_rank=0, send_weights=True,
         reason="hot-spread"),
]


def _setup(h: Harness, case: Case, subject: AdapterRef, ranking: tuple[str, ...]) -> None:
    for rank in case.prefix:
        ticket = h.fleet.start(Decision(ranking[rank], True, False, "test", "setup"), prompt_request(subject))
        h.fleet.confirm(ticket)
        h.fleet.finish(ticket, Outcome.OK)
    for rank in case.evicted:
        for k in range(4):
            h.make_warm(ranking[rank], h.adapter(500 + k))
    for rank in case.warm:
        h.make_warm(ranking[rank], subject)
    for rank, count in case.loads.items():
        h.load(ranking[rank], count)
    for rank, count in case.prefilling.items():
        other = token_block_hashes(list(range(10_000, 10_000 + PROMPT_TOKENS)), 0, 32)  # shares nothing
        ticket = h.fleet.start(Decision(ranking[rank], False, True, "test", "setup"),
                               RouteRequest("m", None, PROMPT_TOKENS, 16, blocks=other))
        h.open.append(ticket)
        if count < 0:
            h.fleet.first_token(ticket)
    for rank, count in case.pinned_loading.items():
        for _ in range(count):
            h.pin(ranking[rank], subject, admitted=False)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_priced_decision(make_harness: Callable[..., Harness], case: Case) -> None:
    h = make_harness("ttft-cost", pods=4, host_pages=4)
    subject = h.adapter(SUBJECT, weights_mib=case.weights_mib)
    ranking = rendezvous_rank(subject.name, h.pod_ids)
    _setup(h, case, subject, ranking)
    decision = h.fleet.route(prompt_request(subject))
    got = (ranking.index(decision.pod), decision.send_weights, decision.reason)
    assert got == (case.expected_rank, case.send_weights, case.reason)


def test_a_prefill_nearly_done_no_longer_drives_requests_away(make_harness: Callable[..., Harness]) -> None:
    """The pending-prefill-spreads case, later: the prompt ahead has computed for 0.115 of its 0.119 s since it
    got the pod, so the warm pod's queue is 4 ms + 5 ms in flight, under an 11.7 ms load elsewhere."""
    h = make_harness("ttft-cost", pods=4, host_pages=4)
    subject = h.adapter(SUBJECT)
    ranking = rendezvous_rank(subject.name, h.pod_ids)
    _setup(h, Case("prefilling", warm=(2,), prefilling={2: 1}), subject, ranking)
    assert ranking.index(h.fleet.route(prompt_request(subject)).pod) == 0
    h.now_s += 0.115
    decision = h.fleet.route(prompt_request(subject))
    assert (ranking.index(decision.pod), decision.send_weights, decision.reason) == (2, False, "warm")


def test_base_model_requests_follow_their_prefix_while_it_is_cheaper(make_harness: Callable[..., Harness]) -> None:
    h = make_harness("ttft-cost", pods=4)
    h.fleet.finish(h.fleet.start(Decision("p1", False, True, "test", "setup"), prompt_request(None)),
                   Outcome.OK)
    h.load("p1", 22)  # 22 x (5 ms + 16 prompt tokens) = 0.115 s of queue < 0.119 s of prefill
    assert h.fleet.route(prompt_request(None)).pod == "p1"
    h.load("p1", 1)  # 0.120 s > 0.119 s
    assert h.fleet.route(prompt_request(None)).pod != "p1"


def test_engine_counters_that_show_less_reuse_lower_the_prefix_price(make_harness: Callable[..., Harness]) -> None:
    h = make_harness("ttft-cost", pods=2)
    subject = h.adapter(SUBJECT)
    h.make_warm("p0", subject)
    h.make_warm("p1", subject)
    h.fleet.observe_metrics("p0", PodMetrics(0, 0, kv_reused_blocks_total=0, kv_missed_blocks_total=0))
    for _ in range(2):  # two turns on p0: the second predicts 256 reused blocks
        h.fleet.finish(h.fleet.start(Decision("p0", False, True, "test", "setup"), prompt_request(subject)),
                       Outcome.OK)
    h.load("p0", 8)
    assert h.fleet.route(prompt_request(subject)).pod == "p0"  # prefix worth more than 8 requests of queue
    # the engine reused nothing of it (another tenant's traffic evicted it): confidence halves, twice
    h.fleet.observe_metrics("p0", PodMetrics(0, 0, kv_reused_blocks_total=0, kv_missed_blocks_total=512))
    h.fleet.finish(h.fleet.start(Decision("p0", False, True, "test", "setup"), prompt_request(subject)),
                   Outcome.OK)
    h.fleet.observe_metrics("p0", PodMetrics(0, 0, kv_reused_blocks_total=0, kv_missed_blocks_total=768))
    assert h.fleet.prefix_index.confidence("p0") == pytest.approx(0.25)
    assert h.fleet.route(prompt_request(subject)).pod == "p1"


@pytest.mark.parametrize(
    ("read_by_pod", "config", "expected_rank"),
    [
        # a 0-byte adapter: only the fixed part prices its load. The warm pod has an 8,192-token prompt
        # prefilling ahead (0.124 s with its 5 ms); the idle cold home costs the load
        pytest.param(False, {"loadOverheadS": 0.0}, 0, id="free-load-goes-to-the-idle-pod"),
        pytest.param(False, {"loadOverheadS": 0.2}, 2, id="dear-load-waits-on-the-warm-pod"),
        pytest.param(False, {"podReadOverheadS": 0.2}, 0, id="weights-sent-ignore-the-pod-read-price"),
        pytest.param(True, {"podReadOverheadS": 0.2}, 2, id="dear-pod-read-waits-on-the-warm-pod"),
        pytest.param(True, {"loadOverheadS": 0.2, "podReadOverheadS": 0.0}, 0, id="pod-reads-ignore-the-send-price"),
    ],
)
def test_a_loads_fixed_cost_is_priced_for_its_runtime(
    make_harness: Callable[..., Harness], read_by_pod: bool, config: dict[str, float], expected_rank: int
) -> None:
    h = make_harness("ttft-cost", pods=4, host_pages=4, config={"ttft_cost": config})
    subject = dataclasses.replace(h.adapter(SUBJECT, weights_mib=0), read_by_pod=read_by_pod)
    ranking = rendezvous_rank(subject.name, h.pod_ids)
    _setup(h, Case("queued", warm=(2,), prefilling={2: 1}), subject, ranking)
    decision = h.fleet.route(prompt_request(subject))
    assert (ranking.index(decision.pod), decision.send_weights) == (expected_rank, expected_rank != 2)


def test_the_load_price_is_the_fixed_part_plus_the_bytes() -> None:
    from trtfleet_router.routing.policies.cold_placement import AdapterPlacementConfig

    config = AdapterPlacementConfig.model_validate({"loadOverheadS": 0.01, "podReadOverheadS": 0.05,
                                                  "linkBandwidthBytesPerS": 1e9, "podReadBytesPerS": 5e8})
    sent = AdapterRef("a", 1, 10**8, 1, 0)
    assert config.load_s(sent) == pytest.approx(0.01 + 0.1)
    assert config.load_s(dataclasses.replace(sent, read_by_pod=True)) == pytest.approx(0.05 + 0.2)
