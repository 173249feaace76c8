"""The router in front of three real reference workers: the next turn of a conversation goes to the pod that
holds its prefix (the router's prefix index, modelled from its own routing), and the index holds each pod to
the KV-cache size the pod's engine reports. The engines' own reuse counters are asserted in the reference
engine's tests and counted by ``bench/prefix_realfleet.py``."""

from __future__ import annotations

import json
import time
import urllib.request
from typing import Any

import openai
import pytest

from tests.integration.router.support import ConvertedAdapter, reference_workers, router_for
from tests.unit.router.harness import RouterThread

pytestmark = pytest.mark.integration


def _pods(router: RouterThread) -> dict[str, dict[str, Any]]:
    url = router.metrics_url.replace("/metrics", "/debug/fleets")
    debug = json.loads(urllib.request.urlopen(url, timeout=10).read())
    return {pod["pod_id"]: pod for pod in debug["tiny"]["pods"]}


def _settled(router: RouterThread, timeout_s: float = 30.0) -> dict[str, dict[str, Any]]:
    """The fleet's books once no request of ours is in flight (the last answer's ticket is finished)."""
    deadline = time.monotonic() + timeout_s
    while True:
        pods = _pods(router)
        if all(pod["inflight"] == 0 for pod in pods.values()):
            return pods
        if time.monotonic() > deadline:
            raise AssertionError(f"requests still in flight: {pods}")
        time.sleep(0.02)


def test_the_next_turn_of_a_conversation_goes_where_its_prefix_is(
    converted_adapters: list[ConvertedAdapter],
) -> None:
    with reference_workers() as workers, router_for(workers, converted_adapters) as router:
        client = openai.OpenAI(base_url=router.http_url + "/v1", api_key="unused", max_retries=0, timeout=60)
        for conversation in range(4):
            first = f"conversation {conversation}: " + "the router keeps the prefix " * 2  # 72+ tokens: 2 blocks
            second = first + "and the next turn follows it"  # 3 full blocks, the first two shared
            assert len(second.encode()) <= 126  # the reference engine's prompt limit
            before = {pod: state["kv_blocks_held"] for pod, state in _settled(router).items()}
            client.completions.create(model="tiny", prompt=first, max_tokens=2)
            after_first = {pod: state["kv_blocks_held"] for pod, state in _settled(router).items()}
            holders = [pod for pod in before if after_first[pod] != before[pod]]
            assert len(holders) == 1, (before, after_first)
            client.completions.create(model="tiny", prompt=second, max_tokens=2)
            after_second = {pod: state["kv_blocks_held"] for pod, state in _settled(router).items()}
            grown = [pod for pod in before if after_second[pod] != after_first[pod]]
            assert grown == holders, (after_first, after_second)
        router.check_books()


def test_the_prefix_index_takes_each_pod_s_kv_cache_size_from_its_engine(
    converted_adapters: list[ConvertedAdapter],
) -> None:
    """Workers whose paged KV cache holds 640 tokens in blocks of 64 export ``max`` 10 and ``tokens_per`` 64;
    the router, which hashes prompts in blocks of 32, sizes each pod at 20 of its blocks instead of the routing
    default (13,000), and a long conversation on one pod never leaves more than that in the index."""
    with reference_workers(kv_max_tokens=640, kv_tokens_per_block=64) as workers, \
            router_for(workers, converted_adapters) as router:
        default = {pod: state["kv_blocks_capacity"] for pod, state in _pods(router).items()}
        deadline = time.monotonic() + 30
        while any(state["kv_blocks_capacity"] != 20 for state in _pods(router).values()):
            assert time.monotonic() < deadline, (default, _pods(router))
            time.sleep(0.05)
        client = openai.OpenAI(base_url=router.http_url + "/v1", api_key="unused", max_retries=0, timeout=60)
        for turn in range(30):  # 3 blocks each: about 30 a pod, over the 20 it holds
            client.completions.create(model="tiny", prompt=f"turn {turn:02d} " + "x" * 110, max_tokens=2)
        pods = _settled(router)
        # 90 distinct blocks on 3 pods: one pod got at least 30, and the index kept its newest 20
        assert max(state["kv_blocks_held"] for state in pods.values()) == 20, pods
        router.check_books()
