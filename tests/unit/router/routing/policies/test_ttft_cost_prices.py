"""The cost policies price queues once per decision (``QueuePrices``): on seeded random fleets they pick exactly what
pricing every pod afresh, scanning the ranking pod by pod, picks."""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable

import pytest
from trtfleet_router.routing import (
    AdapterRef,
    Fleet,
    Outcome,
    PodInfo,
    PodMetrics,
    RouteRequest,
    Ticket,
    build_policy,
    parse_routing_config,
)
from trtfleet_router.routing.framework import PodView, RoutingContext
from trtfleet_router.routing.policies import tiered_cost, ttft_cost
from trtfleet_router.routing.policies.ttft_cost import (
    COST_TIE_S,
    QueuePrices,
    TtftCostConfig,
    TtftCostPolicy,
    tokens_per_step,
)
from trtfleet_router.routing.prefix import PromptBlocks
from trtfleet_router.routing.prefixindex import pending_prefill_of
from trtfleet_router.routing.types import RoutingError

MIB = 2**20


class FreshPrices(QueuePrices):
    """Every pod priced afresh at each call, and the spill scan over the whole ranking with every check per pod."""

    __slots__ = ("fresh_config", "fresh_ctx")

    def __init__(self, ctx: RoutingContext, config: TtftCostConfig) -> None:
        super().__init__(ctx, config)
        self.fresh_ctx = ctx
        self.fresh_config = config

    def of(self, pod_id: str, load: int) -> float:
        ctx, config = self.fresh_ctx, self.fresh_config
        pending_s = ctx.prefix.pending_prefill_s(pod_id, ctx.now_s, config.prefill_s_per_token)
        return load * config.inflight_delay_s / tokens_per_step(ctx, pod_id) + pending_s

    def shortest(
        self, adapter: AdapterRef, can_store: Callable[[PodView, AdapterRef], bool]
    ) -> tuple[PodView, int] | None:
        ctx = self.fresh_ctx
        found: tuple[PodView, int] | None = None
        low = 0.0
        for pod_id in ctx.rankings.rank(adapter.name):
            pod = ctx.by_id[pod_id]
            if not ctx.is_candidate(pod) or pod.residency.is_warm(adapter.task_id):
                continue
            if pod.cache_full_until_s > ctx.now_s:
                continue
            load = ctx.load(pod)
            queue_s = self.of(pod_id, load)
            if (found is None or queue_s < low - COST_TIE_S) and can_store(pod, adapter):
                found, low = (pod, load), queue_s
        return found


class FreshTtftCost(TtftCostPolicy):
    prices = FreshPrices


def fleet_pair(policy: str, seed: int, pods: dict[str, PodInfo], clock: list[float]) -> tuple[Fleet, Fleet]:
    config = parse_routing_config({"policy": policy})
    module = ttft_cost if policy == ttft_cost.NAME else tiered_cost
    section = config.section(module.SECTION, TtftCostConfig if module is ttft_cost else tiered_cost.TieredCostConfig)
    fresh = FreshTtftCost(section, config.no_capacity_retry_after_s, policy)
    fleets = tuple(
        Fleet(chosen, now=lambda: clock[0], rng=random.Random(seed), config=config, model="m")
        for chosen in (build_policy(config), fresh)
    )
    for fleet in fleets:
        fleet.set_pods(pods)
    return fleets[0], fleets[1]


def check_bulk_reads(fleet: Fleet, now_s: float, s_per_token: float) -> None:
    """The direct reads the prices use agree with the per-pod ones."""
    index = fleet.prefix_index
    for pod_id, pod in fleet.pods.items():
        blocks = index.pods.get(pod_id)
        direct = pending_prefill_of(blocks, now_s, s_per_token) if blocks and blocks.pending_prefill_tokens else 0.0
        assert direct == index.pending_prefill_s(pod_id, now_s, s_per_token)
        load = pod.load
        assert load.foreground(now_s) == load.load(now_s) - load.background - load.remote_background


@pytest.mark.parametrize("policy", [ttft_cost.NAME, tiered_cost.NAME])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_queue_prices_pick_what_fresh_pricing_picks(policy: str, seed: int) -> None:
    rng = random.Random(seed)
    pod_count = (4, 16, 48)[seed % 3]
    ids = [f"pod-{i:02d}" for i in range(pod_count)]
    pods = {
        pod_id: PodInfo(pod_id, f"10.0.0.{i}:8001", f"uid-{i}", rng.choice([8, 16, 64]), rng.choice([4, 16]))
        for i, pod_id in enumerate(ids)
    }
    clock = [100.0]
    fast, fresh = fleet_pair(policy, seed, pods, clock)
    adapters = [
        AdapterRef(f"adapter-{i}", i + 1, rng.choice([8, 64]) * MIB, rng.choice([1, 2, 4])) for i in range(300)
    ]
    weights = [1.0 / rank for rank in range(1, len(adapters) + 1)]
    open_tickets: deque[tuple[Ticket, Ticket]] = deque()
    decisions = 0
    for step in range(1500):
        clock[0] += rng.choice([0.0, 0.0005, 0.002, 0.01])
        if step % 400 == 200:
            for fleet in (fast, fresh):
                fleet.replan(adapters[:120])
        if rng.random() < 0.05:
            metrics = PodMetrics(active_requests=rng.randint(0, 9), waiting_requests=rng.randint(0, 4),
                                 tokens_per_step=rng.choice([None, 0.5, 1.5, 3.0]))
            pod_id = rng.choice(ids)
            for fleet in (fast, fresh):
                fleet.observe_metrics(pod_id, metrics)
        adapter = rng.choices(adapters, weights=weights)[0] if rng.random() > 0.05 else None
        prompt_tokens = rng.choice([16, 256, 2000])
        conversation = rng.randrange(30)
        hashes = tuple(hash((adapter.task_id if adapter else 0, conversation, block)) & (2**63 - 1)
                       for block in range(prompt_tokens // 16))
        request = RouteRequest(
            "m", adapter, prompt_tokens, 64, request_id=str(step),
            exclude_pods=frozenset(rng.sample(ids, min(2, pod_count - 1))) if rng.random() < 0.1 else frozenset(),
            blocks=PromptBlocks(hashes, 16, True),
            background=rng.random() < 0.05,
            reserve_pods=2 if rng.random() < 0.1 else 0,
            reserve_room=4,
        )
        try:
            decision = fast.route(request)
        except RoutingError as exc:
            with pytest.raises(type(exc)):
                fresh.route(request)
            continue
        assert fresh.route(request) == decision, f"step {step}: {request}"
        decisions += 1
        tickets = (fast.start(decision, request), fresh.start(decision, request))
        open_tickets.append(tickets)
        if rng.random() < 0.5:
            for fleet, ticket in zip((fast, fresh), tickets, strict=True):
                fleet.first_token(ticket)
        while len(open_tickets) > 120 or (open_tickets and rng.random() < 0.3):
            outcome = rng.choices(list(Outcome), weights=[90 if o is Outcome.OK else 3 for o in Outcome])[0]
            for fleet, ticket in zip((fast, fresh), open_tickets.popleft(), strict=True):
                fleet.finish(ticket, outcome)
        if step % 50 == 0:
            check_bulk_reads(fast, clock[0], TtftCostConfig().prefill_s_per_token)
    assert decisions > 1000  # the stream routed, not only raised
