"""The placement in front of real reference workers (tritonserver, tiny Llama, TRT-LLM's LoRA contract):
planned adapters are in their pods' host tiers before their first request, and interactive requests running
while prefetches are pushed wait no longer than the bound the pacing states.

The workers pay a GPU pod's costs (``--network-bytes-per-s``, ``--pcie-bytes-per-s``, a minimum step time),
scaled so the tiny adapters' transfers take a measurable time: weights cross each worker's link at a rate
that makes one adapter's transfer ``TRANSFER_S``.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from trtfleet_router.routing import parse_routing_config
from trtfleet_router.routing.prefetch import added_queueing_bound_s

from tests.integration.router.direct import direct_generate
from tests.integration.router.support import ConvertedAdapter, reference_workers, router_for
from tests.support.controlplane import eventually
from tests.unit.router.harness import RouterThread

pytestmark = pytest.mark.integration

STEP_MS = 30.0
TRANSFER_S = 0.15
PLACEMENT = {
    "policy": "tiered-cost",
    "placement": {
        "enabled": True,
        "minHostCopies": 1,
        "hostFill": 1.0,
        "intervalS": 0.2,
        "prefetch": {"tickS": 0.02, "maxInflightPerPod": 1},
    },
}


def _snapshot(router: RouterThread) -> dict[str, Any]:
    url = router.metrics_url.replace("/metrics", "/debug/fleets")
    return dict(json.loads(urllib.request.urlopen(url, timeout=10).read())["tiny"])


def _routes_and_loads(router: RouterThread) -> dict[str, tuple[int, int]]:
    """Each pod's (warm routes, cold loads) as the router counts them."""
    return {pod["pod_id"]: (pod["warm_routes_total"], pod["cold_loads_total"]) for pod in _snapshot(router)["pods"]}


def _fleet(router: RouterThread) -> Any:
    return router.router.fleets.fleets["tiny"]


@pytest.fixture(scope="module")
def network_bytes_per_s(converted_adapters: list[ConvertedAdapter]) -> float:
    weights, _config = converted_adapters[0].weights()
    return float(weights.astype("float16").nbytes) / TRANSFER_S


@pytest.fixture(scope="module")
def workers(network_bytes_per_s: float) -> Iterator[list[Any]]:
    with reference_workers(min_step_ms=STEP_MS, network_bytes_per_s=network_bytes_per_s, pcie_bytes_per_s=50e9) as w:
        yield w


def test_a_predicted_adapter_is_host_resident_on_its_pod_before_its_first_request(
    workers: list[Any], converted_adapters: list[ConvertedAdapter]
) -> None:
    with router_for(workers, converted_adapters, routing=parse_routing_config(PLACEMENT)) as router:
        fleet = _fleet(router)
        # no request has been sent: the plan holds every registered adapter once (minHostCopies), from no demand
        eventually(lambda: fleet.placement.copies() == len(converted_adapters), timeout=30)
        planned = {a.task_id: fleet.placement.pods_of(a.task_id)[0] for a in converted_adapters}

        def resident() -> bool:
            pods = {pod["pod_id"]: set(pod["resident_task_ids"]) for pod in _snapshot(router)["pods"]}
            return all(task in pods[pod] for task, pod in planned.items()) and fleet.placer.pacer.inflight_total() == 0

        eventually(resident, timeout=60)
        assert router.router.placement.pushed_total >= len(converted_adapters)
        # the engines' own caches hold them: an id-only request straight to the planned worker is no miss
        for adapter in converted_adapters:
            worker = workers[int(planned[adapter.task_id].removeprefix("w"))]
            direct_generate(worker, "probe", 1, adapter, send_weights=False)
        before = _routes_and_loads(router)
        client = openai.OpenAI(base_url=router.http_url + "/v1", api_key="unused", max_retries=0, timeout=60)
        first = converted_adapters[1]
        client.completions.create(model=first.name, prompt="hello", max_tokens=4)
        after = _routes_and_loads(router)
        home = planned[first.task_id]
        assert after[home][0] == before[home][0] + 1  # its first request went warm to the pod the plan chose
        assert sum(cold for _warm, cold in after.values()) == sum(cold for _warm, cold in before.values())
        router.check_books()


def _ttfts(router: RouterThread, streams: int, per_stream: int) -> list[float]:
    """First-token times of base-model requests, ``streams`` at a time."""
    client = openai.OpenAI(base_url=router.http_url + "/v1", api_key="unused", max_retries=0, timeout=60)
    times: list[float] = []
    lock = threading.Lock()

    def stream() -> None:
        for _ in range(per_stream):
            started = time.monotonic()
            chunks = client.completions.create(model="tiny", prompt="hello there", max_tokens=3, stream=True)
            first: float | None = None
            for _chunk in chunks:
                if first is None:
                    first = time.monotonic() - started
            with lock:
                times.append(first if first is not None else float("inf"))

    threads = [threading.Thread(target=stream) for _ in range(streams)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return times


def test_interactive_requests_during_prefetch_wait_no_longer_than_the_stated_bound(
    workers: list[Any], converted_adapters: list[ConvertedAdapter], network_bytes_per_s: float
) -> None:
    """Base-model requests, one stream per worker, first with nothing to prefetch, then while the placement pushes
    every adapter: at most one prefetch is in flight per pod at any time, and the requests' first tokens come no
    later than without prefetching plus the stated bound (one transfer, one step and one copy per prefetch in
    flight: ``routing.prefetch.added_queueing_bound_s``)."""
    config = parse_routing_config(PLACEMENT)
    weights = converted_adapters[0].weights()[0].astype("float16").nbytes
    bound_s = added_queueing_bound_s(config.placement.prefetch, weights, network_bytes_per_s, STEP_MS / 1e3, 0.0)
    quiet = parse_routing_config({**PLACEMENT, "placement": {**PLACEMENT["placement"], "enabled": False}})
    with router_for(workers, converted_adapters, routing=quiet) as router:
        alone = _ttfts(router, len(workers), 8)
    for worker in workers:  # empty the engines' caches: the placement must push everything again
        for offset, adapter in enumerate(converted_adapters):
            direct_generate(worker, "x", 1, ConvertedAdapter("evictor", 900 + offset, adapter.path))
    with router_for(workers, converted_adapters, routing=config) as router:
        fleet = _fleet(router)
        peak: list[int] = []
        sampling = threading.Event()

        def sample() -> None:
            while not sampling.is_set():
                peak.append(max((fleet.placer.pacer.inflight(pod) for pod in fleet.pods), default=0))
                time.sleep(0.005)

        sampler = threading.Thread(target=sample)
        sampler.start()
        try:
            during = _ttfts(router, len(workers), 8)
        finally:
            sampling.set()
            sampler.join()
        eventually(lambda: fleet.placer.pacer.inflight_total() == 0 and fleet.placer.pending() == 0, timeout=60)
        assert router.router.placement.pushed_total > 0
        router.check_books()
    assert max(peak) == config.placement.prefetch.max_inflight_per_pod  # prefetches did run among the requests
    assert statistics.median(during) <= statistics.median(alone) + bound_s
    assert max(during) <= max(alone) + bound_s
