"""The router in front of a ``pytorch`` fleet: reference trtllm-serve workers, the official openai client.

Every worker is a real subprocess (``python -m trtfleet_engines.reference.serve``) with a device tier of one
adapter and a host tier of two; the router reads the tiers' pages from the fleet file (taken here from a
worker's ``/reference/lora_cache``, as an operator would put them in ``status.capacity``). Expected greedy
outputs are the fixture the Triton reference engine is tested against.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.integration.reference.serve_process import ServeProcess, serving
from tests.integration.reference.triton_client import wait_until
from tests.integration.router.sample_fleet import (
    ADAPTERS,
    MAX_TOKENS,
    OUTPUTS,
    PROMPTS,
    TASK_IDS,
    check_each_prompts_output,
    check_more_adapters_than_a_tier,
    check_triton_endpoints_refused,
    openai_client,
    pytorch_fleet_config,
    served_name,
    start_router,
)
from tests.unit.router.harness import RouterThread

pytestmark = pytest.mark.integration

WORKER_ARGS = ["--served_model_name", "tiny", "--max-loras", "1", "--max-cpu-loras", "2", "--max-lora-rank", "8"]


def fleet(workers: list[ServeProcess]) -> dict[str, Any]:
    backends = [{"address": w.url.removeprefix("http://"), "podId": f"w{i}"} for i, w in enumerate(workers)]
    return pytorch_fleet_config(backends, workers[0].lora_cache())


class Fleet:
    def __init__(self, workers: list[ServeProcess], router: RouterThread) -> None:
        self.workers = workers
        self.router = router

    def client(self) -> openai.OpenAI:
        return openai_client(self.router)

    def metric(self, name: str) -> float:
        text = httpx.get(self.router.metrics_url, timeout=10).text
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


def _started(stack: ExitStack, tmp: Path, count: int, *, killed: int = 0) -> list[ServeProcess]:
    """``count`` workers; the first ``killed`` may die on purpose (no clean exit expected)."""
    return [stack.enter_context(serving(tmp, WORKER_ARGS, clean_exit=i >= killed)) for i in range(count)]


@pytest.fixture(scope="module")
def pytorch_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with ExitStack() as stack:
        workers = _started(stack, tmp_path_factory.mktemp("pytorch-fleet"), 3)
        yield Fleet(workers, start_router(stack, fleet(workers)))


@pytest.mark.parametrize("name", ["base", *ADAPTERS])
def test_openai_client_gets_each_adapters_outputs(pytorch_fleet: Fleet, name: str) -> None:
    check_each_prompts_output(pytorch_fleet.client(), name, usage=True)


def test_more_adapters_than_a_tier_holds_spread_or_wait_never_fail(pytorch_fleet: Fleet) -> None:
    """Three adapters in flight at once, each pod's device tier holds one: every answer is right."""
    check_more_adapters_than_a_tier(pytorch_fleet.router, rounds=4, threads=9)
    loaded = [set(w.lora_cache()["loads"]) for w in pytorch_fleet.workers]
    assert sum(1 for ids in loaded if ids) >= 2, loaded  # spread over pods, not all on one


def test_a_killed_workers_requests_are_retried(tmp_path: Path) -> None:
    """A worker killed with SIGKILL: requests routed there (refused before any token) go to another pod."""
    with ExitStack() as stack:
        workers = _started(stack, tmp_path, 2, killed=1)
        fleet_ = Fleet(workers, start_router(stack, fleet(workers)))
        victim = workers[0].process
        victim.kill()
        wait_until(lambda: victim.poll() is not None, timeout_s=30)
        client = fleet_.client()
        for name in ("base", *ADAPTERS):
            for index, prompt in enumerate(PROMPTS[:3]):
                answer = client.completions.create(model=served_name(name), prompt=prompt, max_tokens=MAX_TOKENS,
                                                   temperature=0)
                assert answer.choices[0].text == OUTPUTS[name][index]
        assert fleet_.metric('trtfleet_router_upstream_retries_total{reason="pod_failed"}') >= 1


def _cancelled(worker: ServeProcess) -> float:
    """Requests the worker ended as ``cancelled`` (its client, the router, went away)."""
    for line in worker.get("/prometheus/metrics").text.splitlines():
        if line.startswith("trtllm_request_success_total{") and 'finished_reason="cancelled"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_a_client_that_goes_away_cancels_the_request_on_the_pod(tmp_path: Path) -> None:
    """The router closes its connection to the pod when its client hangs up, streaming or not; the pod
    then ends the request as cancelled (a finished one would say stop or length). 50 ms steps and 128
    tokens (this prompt runs to the length limit): each request has about 6 s of steps left when its
    client leaves."""
    prompt = "the quick brown fox jumps over the lazy dog " * 2
    with ExitStack() as stack:
        workers = [stack.enter_context(serving(tmp_path, [*WORKER_ARGS, "--min-step-ms", "50"]))]
        fleet_ = Fleet(workers, start_router(stack, fleet(workers)))
        worker = workers[0]
        before = _cancelled(worker)
        stream = fleet_.client().completions.create(model="tiny-upper", prompt=prompt, max_tokens=128,
                                                     temperature=0, stream=True)
        assert next(iter(stream)).choices[0].text  # a first piece: the request runs on the pod
        stream.close()
        wait_until(lambda: _cancelled(worker) == before + 1, timeout_s=30)
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(fleet_.router.http_url + "/v1/completions", timeout=1.0,
                       json={"model": "tiny-upper", "prompt": prompt, "max_tokens": 128, "temperature": 0})
        wait_until(lambda: _cancelled(worker) == before + 2, timeout_s=30)


def test_triton_endpoints_say_to_use_the_openai_api(pytorch_fleet: Fleet) -> None:
    check_triton_endpoints_refused(pytorch_fleet.router)


def test_min_pods_prewarm_makes_the_pod_read_the_adapter(tmp_path: Path) -> None:
    """``warm.minPods``: the router sends a one-token request with the adapter's lora_request, unasked."""
    with ExitStack() as stack:
        workers = _started(stack, tmp_path, 1)
        config = fleet(workers)
        config["baseModels"][0]["adapters"][1]["minPods"] = 1  # tiny-reverse
        start_router(stack, config, prewarm_interval_s=0.2)
        wait_until(lambda: workers[0].lora_cache()["loads"] == [TASK_IDS["reverse"]], timeout_s=30)
        assert workers[0].lora_cache()["loads"] == [TASK_IDS["reverse"]]  # read once, by the prewarm alone
