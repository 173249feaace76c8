"""Scale from zero on real processes: requests arrive while the base model has no pod, the router holds
them, a real reference worker (tritonserver) starts afterwards and joins the fleet, and every held request
is answered with the text the worker gives directly: none lost."""

from __future__ import annotations

import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
from trtfleet_router.discovery.static import FleetConfig, snapshot_from_config
from trtfleet_router.routing import RoutingConfig

from tests.integration.router.direct import direct_generate
from tests.integration.router.support import ConvertedAdapter, fleet_config, reference_workers, router_for
from tests.unit.router.harness import RouterThread

pytestmark = pytest.mark.integration

HELD = 6


def _apply(router: RouterThread, fleet: dict[str, object]) -> None:
    snapshot = snapshot_from_config(FleetConfig.model_validate(fleet))

    async def apply() -> None:
        router.router.fleets.apply(snapshot)

    router.loop.run(apply())


def _wait_held(router: RouterThread, count: int) -> None:
    held = router.router.metrics.held_requests.labels("tiny")
    deadline = time.monotonic() + 60
    while held.value < count:
        assert time.monotonic() < deadline, f"{held.value} requests held, expected {count}"
        time.sleep(0.01)


def test_requests_held_at_zero_are_answered_by_a_worker_started_later(
    converted_adapters: list[ConvertedAdapter],
) -> None:
    with router_for([], converted_adapters, routing=RoutingConfig(hold_wait_s=300)) as router:
        client = openai.OpenAI(base_url=router.http_url + "/v1", api_key="unused", max_retries=0, timeout=300)
        models = [a.name for a in converted_adapters] + ["tiny"]

        def ask(index: int) -> tuple[str, str, str]:
            model, prompt = models[index % len(models)], f"held {index}"
            return model, prompt, client.completions.create(model=model, prompt=prompt, max_tokens=12).choices[0].text

        with ThreadPoolExecutor(max_workers=HELD) as pool:
            futures = [pool.submit(ask, i) for i in range(HELD)]
            _wait_held(router, HELD)  # every request arrived and waits: no pod exists yet
            assert not any(f.done() for f in futures)
            metrics = urllib.request.urlopen(router.metrics_url, timeout=10).read().decode()
            assert f'trtfleet_router_held_requests{{base_model="tiny"}} {HELD:.1f}' in metrics
            with reference_workers(1) as workers:  # the pod starts after the requests arrived
                _apply(router, fleet_config(workers, converted_adapters))
                results = [future.result(timeout=300) for future in futures]
                by_name = {a.name: a for a in converted_adapters}
                for model, prompt, text in results:
                    adapter = by_name.get(model)
                    shadow = None if adapter is None else ConvertedAdapter(model, 700 + adapter.task_id, adapter.path)
                    assert text == direct_generate(workers[0], prompt, 12, shadow), (model, prompt)
        assert len(results) == HELD
        assert router.router.metrics.holds.labels("tiny", "released").value == HELD
        assert router.router.metrics.held_requests.labels("tiny").value == 0
        router.check_books()
