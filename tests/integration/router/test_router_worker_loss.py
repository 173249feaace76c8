"""A worker killed mid-run: requests that had not started streaming are retried elsewhere (invisibly),
a stream that had started ends with a clear error, and the router keeps serving on the others."""

from __future__ import annotations

import json
import signal
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from tests.integration.router.direct import direct_generate
from tests.integration.router.support import ConvertedAdapter, reference_workers, router_for
from tests.unit.router.harness import RouterThread

pytestmark = pytest.mark.integration

STEP_MS = 25.0  # a pretend GPU step, so requests are in flight long enough to be cut


def _inflight(router: RouterThread) -> dict[str, int]:
    url = router.metrics_url.replace("/metrics", "/debug/fleets")
    debug = json.loads(urllib.request.urlopen(url, timeout=10).read())
    return {pod["pod_id"]: pod["inflight"] for pod in debug["tiny"]["pods"]}


def test_worker_killed_mid_run(converted_adapters: list[ConvertedAdapter]) -> None:
    with reference_workers(min_step_ms=STEP_MS) as workers, router_for(workers, converted_adapters) as router:
        client = openai.OpenAI(base_url=router.http_url + "/v1", api_key="unused", max_retries=0, timeout=120)
        prompt = "keep going"
        expected = {
            a.name: direct_generate(workers[0], prompt, 16, ConvertedAdapter(a.name, 700 + a.task_id, a.path))
            for a in converted_adapters
        }

        stream = client.completions.create(model=converted_adapters[0].name, prompt=prompt, max_tokens=200, stream=True)
        chunks = iter(stream)
        first = next(chunks).choices[0].text
        busy = [pod for pod, count in _inflight(router).items() if count]
        assert len(busy) == 1 and first
        victim = workers[int(busy[0].removeprefix("w"))]
        # Frozen (not yet dead), the victim cannot finish the stream, however long the unary requests below take
        # to reach it: the stream is certain to be cut mid-way. The router does not see a stopped pod (a scrape
        # that times out is skipped), so it routes to it as before.
        victim.process.send_signal(signal.SIGSTOP)

        def unary(index: int) -> tuple[str, str]:
            adapter = converted_adapters[index % len(converted_adapters)]
            text = client.completions.create(model=adapter.name, prompt=prompt, max_tokens=16).choices[0].text
            return adapter.name, text

        with ThreadPoolExecutor(max_workers=12) as pool:
            futures = [pool.submit(unary, i) for i in range(24)]
            deadline = time.monotonic() + 30
            while _inflight(router).get(busy[0], 0) < 2:  # a unary request sent to the frozen victim
                assert time.monotonic() < deadline, "no unary request reached the victim: nothing would be retried"
                time.sleep(0.01)
            victim.process.kill()
            results = [future.result(timeout=120) for future in futures]
        assert all(text == expected[name] for name, text in results)

        with pytest.raises(openai.APIError, match="broke after it started"):
            for _ in chunks:
                pass

        for adapter in converted_adapters:  # the survivors serve everything, without touching the dead pod
            text = client.completions.create(model=adapter.name, prompt=prompt, max_tokens=16).choices[0].text
            assert text == expected[adapter.name]
        metrics = urllib.request.urlopen(router.metrics_url, timeout=10).read().decode()
        assert 'trtfleet_router_upstream_retries_total{reason="pod_failed"}' in metrics
        deadline = time.monotonic() + 10
        while router.router.lifecycle.inflight and time.monotonic() < deadline:
            time.sleep(0.05)
        router.check_books()
