"""A merged adapter through the router: its requests go to its merged pods, hot-swapped on the shared pool
while they are not there, and switching between the two under traffic loses no request.

Real processes: a reference trtllm-serve worker for the shared BaseModel ``tiny`` (the sample adapters by PEFT
path), a ``trtfleet worker --runtime pytorch --merged-adapter`` for the merged one, the router, and the official
openai client. The fleet changes as discovery would see them (the same ``Router.apply`` the watch calls).
"""

from __future__ import annotations

import json
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from trtfleet_engines.reference.numpy_llama import SAMPLE_ADAPTER_NAMES, SAMPLE_ADAPTERS_DIR
from trtfleet_engines.reference.server import free_port
from trtfleet_router.discovery.static import FleetConfig, snapshot_from_config

from tests.integration.reference.serve_process import serving, trtfleet_worker
from tests.integration.reference.triton_client import wait_until
from tests.integration.router.test_router_migration import Traffic, _routes
from tests.support.lora_outputs import FIXTURE
from tests.unit.router.harness import LoopThread, RouterThread

pytestmark = pytest.mark.integration

MAX_TOKENS: int = FIXTURE["max_new_tokens"]
SHARED_ARGS = ["--served_model_name", "tiny", "--max-loras", "1", "--max-cpu-loras", "3", "--max-lora-rank", "8"]


def fleet(shared_url: str, merged: str, merged_url: str | None) -> dict[str, Any]:
    """``tiny`` on the shared pod with every sample adapter; ``merged`` also on its merged pod when given."""
    adapters = [{"servedName": name, "taskId": i + 1, "artifact": str(SAMPLE_ADAPTERS_DIR / name), "pages": 1}
                for i, name in enumerate(SAMPLE_ADAPTER_NAMES)]
    merged_backends = [] if merged_url is None else [{"address": merged_url.removeprefix("http://"), "podId": "m-0"}]
    return {"baseModels": [{
        "name": "tiny", "runtime": "pytorch", "architecture": "reference", "maxInputLen": 128, "maxSeqLen": 256,
        "hostPages": 8, "devicePages": 4,
        "backends": [{"address": shared_url.removeprefix("http://"), "podId": "shared-0"}],
        "adapters": adapters,
        "mergedAdapters": [{"servedName": merged, "backends": merged_backends}],
    }]}


def apply(router: RouterThread, loop: LoopThread, config: dict[str, Any]) -> None:
    snapshot = snapshot_from_config(FleetConfig.model_validate(config))

    async def swap() -> None:
        router.router.apply(snapshot)

    loop.run(swap())


def served(url: str) -> int:
    """Requests a reference trtllm-serve pod finished (its ``trtllm_request_success_total``)."""
    text = httpx.get(f"{url}/prometheus/metrics", timeout=30).text
    return int(sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("trtllm_request_success_total")))


def ask_all(client: openai.OpenAI, name: str) -> list[str]:
    return [client.completions.create(model=name, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0).choices[0].text
            for prompt in FIXTURE["prompts"]]


@pytest.mark.parametrize("name", SAMPLE_ADAPTER_NAMES)
def test_merged_and_hot_swapped_give_the_same_greedy_outputs(name: str, tmp_path: Path) -> None:
    want = FIXTURE["models"][name]["outputs"]
    port = free_port()
    with ExitStack() as stack:
        shared = stack.enter_context(serving(tmp_path, SHARED_ARGS))
        stack.enter_context(trtfleet_worker(tmp_path, ["--runtime", "pytorch", "--http-port", str(port),
                                                       "--merged-adapter", str(SAMPLE_ADAPTERS_DIR / name)],
                                            ready_path="/health", port=port))
        loop = LoopThread()
        stack.callback(loop.close)
        router = RouterThread(loop, fleet(shared.url, name, f"127.0.0.1:{port}"))
        stack.callback(router.stop)
        client = openai.OpenAI(base_url=router.http_url + "/v1", api_key="unused", max_retries=0, timeout=60)

        merged_url = f"http://127.0.0.1:{port}"
        assert ask_all(client, name) == want  # merged pod up: it takes them
        assert (served(merged_url), served(shared.url)) == (len(want), 0)

        apply(router, loop, fleet(shared.url, name, None))  # merged pods scaled to zero: hot-swapped
        assert ask_all(client, name) == want
        assert (served(merged_url), served(shared.url)) == (len(want), len(want))
        assert name in [m.id for m in client.models.list().data]


def test_switching_modes_under_traffic_loses_no_request(tmp_path: Path) -> None:
    port = free_port()
    with ExitStack() as stack:
        shared = stack.enter_context(serving(tmp_path, SHARED_ARGS))
        merged = stack.enter_context(trtfleet_worker(
            tmp_path, ["--runtime", "pytorch", "--http-port", str(port), "--merged-adapter",
                       str(SAMPLE_ADAPTERS_DIR / "upper"), "--merged-adapter-name", "tiny-upper"],
            ready_path="/health", port=port))
        loop = LoopThread()
        stack.callback(loop.close)
        dynamic = fleet(shared.url, "tiny-upper", None)
        dynamic["baseModels"][0]["adapters"].append(
            {"servedName": "tiny-upper", "taskId": 9, "artifact": str(SAMPLE_ADAPTERS_DIR / "upper"), "pages": 1})
        with_merged = json.loads(json.dumps(dynamic))
        with_merged["baseModels"][0]["mergedAdapters"][0]["backends"] = [{"address": f"127.0.0.1:{port}",
                                                                           "podId": "m-0"}]
        router = RouterThread(loop, dynamic)
        stack.callback(router.stop)
        traffic = Traffic(router)  # asks for "tiny" and "tiny-upper", checks every answer
        stack.callback(traffic.stop)
        wait_until(traffic.answered_at_least(6), timeout_s=120)

        apply(router, loop, with_merged)  # the merged pod is ready: the adapter's requests move to it
        merged_url = f"http://127.0.0.1:{port}"
        wait_until(lambda: served(merged_url) >= 3, timeout_s=120)
        merged_served = served(merged_url)
        shared_adapter_routes = _routes(router, "tiny")

        apply(router, loop, dynamic)  # back to dynamic: the merged pod leaves the fleet, then stops
        merged.terminate()
        merged.wait(timeout=30)
        wait_until(traffic.answered_at_least(traffic.answered + 6), timeout_s=120)
        traffic.stop()

        assert traffic.failures == [], traffic.failures[:5]
        assert merged_served >= 3 and _routes(router, "tiny") > shared_adapter_routes  # hot-swapped again
