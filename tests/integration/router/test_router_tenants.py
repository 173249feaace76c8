"""Tenants and priority bands end to end: reference trtllm-serve workers (real subprocesses), the router in process,
the official openai client, one API key per tenant.

* A flooding tenant and a steady one on different adapters, the fleet saturated (``tenancy.saturation``): the
  steady tenant's requests start after at most one of the flood's queued requests each, never refused; the flood's
  excess is refused with 429 and a body that says the tenant is over its share. First come, first served, the same
  run turns the steady tenant away (the flood filled the line first).
* A critical request overtakes sheddable ones waiting in the router; and, with no saturation limit (the requests
  queue in the pod) and the BaseModel's ``waitingQueuePolicy: priority``, in the engine's own waiting queue.

Order is read from when each request's first token reached its client (each thread stamps its own); no timing is
asserted, only the order the router and the engine chose.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai
import pytest
import yaml
from trtfleet_router.routing import RoutingConfig

from tests.integration.reference.serve_process import ServeProcess, serving
from tests.integration.reference.triton_client import wait_until
from tests.integration.router.sample_fleet import pytorch_fleet_config, served_name, start_router
from tests.unit.router.harness import RouterThread

pytestmark = pytest.mark.integration

PROMPT = "the quick brown fox jumps over the lazy dog " * 2  # runs to the length limit: every answer as long
KEYS = {"flood": "sk-tenant-flood-0001", "steady": "sk-tenant-steady-0002", "vip": "sk-tenant-vip-00003"}


def _keys_file(tmp: Path) -> Path:
    path = tmp / "keys.yaml"
    path.write_text(yaml.safe_dump({"keys": [{"name": name, "key": key} for name, key in KEYS.items()]}))
    return path


def _worker_args(batch: int, *extra: str) -> list[str]:
    return ["--served_model_name", "tiny", "--max-loras", "3", "--max-cpu-loras", "3", "--max-lora-rank", "8",
            "--max_batch_size", str(batch), "--min-step-ms", "25", *extra]


def _router(stack: ExitStack, tmp: Path, worker: ServeProcess, tenancy: dict[str, Any], *, scraped: bool = False,
            **base: Any) -> RouterThread:
    """The router in front of ``worker``; ``scraped``: it reads the worker's load from its ``/metrics`` too."""
    address = worker.url.removeprefix("http://")
    backend = {"address": address, "podId": "w0"} | ({"metrics": address} if scraped else {})
    config = pytorch_fleet_config([backend], worker.lora_cache(), **base)
    routing = RoutingConfig.model_validate({"capacityWaitS": 60, "capacityQueueMax": 6, "tenancy": tenancy})
    return start_router(stack, config, routing=routing, api_keys_path=_keys_file(tmp))


def _client(router: RouterThread, tenant: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=router.http_url + "/v1", api_key=KEYS[tenant], max_retries=0, timeout=120)


@dataclass
class Outcome:
    name: str
    sent_s: float
    first_token_s: float | None = None
    error: openai.APIStatusError | None = None


@dataclass
class Run:
    outcomes: list[Outcome] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def stream(self, client: openai.OpenAI, name: str, model: str, *, max_tokens: int = 24, **extra: Any) -> Outcome:
        outcome = Outcome(name, time.monotonic())
        with self.lock:
            self.outcomes.append(outcome)
        try:
            stream = client.completions.create(model=model, prompt=PROMPT, max_tokens=max_tokens, temperature=0,
                                               stream=True, extra_body=extra or None)
            for chunk in stream:
                if outcome.first_token_s is None and chunk.choices and chunk.choices[0].text:
                    outcome.first_token_s = time.monotonic()
        except openai.APIStatusError as exc:
            outcome.error = exc
        return outcome

    def started_between(self, prefix: str, since_s: float, until_s: float) -> int:
        """Requests named ``prefix``* whose first token came after ``since_s`` and before ``until_s``."""
        return sum(
            1
            for o in self.outcomes
            if o.name.startswith(prefix) and o.first_token_s is not None and since_s < o.first_token_s < until_s
        )


def _until_waiting(router: RouterThread, count: int) -> None:
    waiting = router.router.metrics.capacity_waiting.labels("tiny")
    wait_until(lambda: waiting.value >= count, timeout_s=60)


@pytest.fixture
def worker(tmp_path: Path) -> Iterator[ServeProcess]:
    with serving(tmp_path, _worker_args(2)) as process:
        yield process


@pytest.mark.parametrize(("order", "fair"), [pytest.param("vtc", True, id="vtc"), pytest.param("fcfs", False,
                                                                                                  id="fcfs")])
def test_a_flooding_tenant_does_not_starve_a_steady_one(
    tmp_path: Path, worker: ServeProcess, order: str, fair: bool
) -> None:
    with ExitStack() as stack:
        router = _router(stack, tmp_path, worker, {"order": order, "saturation": {"inflightPerPod": 2}})
        flood, steady = _client(router, "flood"), _client(router, "steady")
        run = Run()
        run.stream(steady, "warmup", served_name("reverse"))  # the steady tenant was served lately too
        with ThreadPoolExecutor(max_workers=16) as pool:
            floods = [pool.submit(run.stream, flood, f"a{i}", served_name("upper"), max_tokens=48) for i in range(10)]
            _until_waiting(router, 6)  # two at the pod, six queued: the line is full, the rest refused
            steadies = []
            for index in range(3):  # one at a time, as a steady client under its share sends them
                steadies.append(run.stream(steady, f"b{index}", served_name("reverse")))
            for future in floods:
                future.result()
    refused = [o.error for o in run.outcomes if o.error is not None]
    assert refused and all(e.status_code == 429 for e in refused)
    if not fair:  # first come, first served: a full line of the flood turns the steady tenant away
        assert steadies[0].error is not None and steadies[0].error.status_code == 429
        return
    assert all(b.error is None and b.first_token_s is not None for b in steadies)
    ahead = [run.started_between("a", b.sent_s, b.first_token_s or 0.0) for b in steadies]
    # each steady request waits for at most the flood's next request (a tie of counters goes to the older)
    assert max(ahead) <= 2, ahead
    body = refused[0].body
    assert isinstance(body, dict) and body.get("code") == "tenant_over_share"
    assert "tenant 'flood' is over its share of base model 'tiny'" in str(body.get("message"))
    assert int(refused[0].response.headers["Retry-After"]) >= 1
    metrics = router.router.metrics
    assert metrics.shed_requests.labels("tiny", "interactive", "flood", "tenant_over_share").value >= 1
    assert metrics.tenant_tokens.labels("tiny", "steady", "output").value >= 4 * 24


def test_a_critical_request_overtakes_waiting_sheddable_ones_in_the_router(
    tmp_path: Path, worker: ServeProcess
) -> None:
    tenancy = {
        "saturation": {"inflightPerPod": 2},
        "adapters": {served_name("upper"): "sheddable"},
        "tenants": {"vip": {"priority": "critical"}},
    }
    with ExitStack() as stack:
        router = _router(stack, tmp_path, worker, tenancy)
        run = Run()
        flood, vip_client = _client(router, "flood"), _client(router, "vip")
        with ThreadPoolExecutor(max_workers=8) as pool:
            lows = [pool.submit(run.stream, flood, f"s{i}", served_name("upper"), max_tokens=64) for i in range(6)]
            _until_waiting(router, 4)
            vip = run.stream(vip_client, "vip", served_name("reverse"))
            for future in lows:
                assert future.result().error is None
    assert vip.first_token_s is not None
    # before its first token: the two already on the pod, and at most one more: when both end in the same engine
    # step, the vip takes one freed slot and the next waiting request the other, and their first tokens come in
    # the same step, in either order (the four waiting would all come first, six in all, without the bands)
    assert run.started_between("s", vip.sent_s, vip.first_token_s) <= 3
    assert _overtaken(run, vip) >= 2  # of the four waiting when it came
    assert router.router.metrics.queue_wait.labels("tiny", "critical", "vip").counts[-1] == 0  # type: ignore[attr-defined]


def test_a_critical_request_overtakes_sheddable_ones_in_the_engine_queue(tmp_path: Path) -> None:
    options = tmp_path / "options.yaml"
    options.write_text("scheduler_config: {waiting_queue_policy: priority}\n")
    tenancy = {"adapters": {served_name("upper"): "sheddable"}, "tenants": {"vip": {"priority": "critical"}}}
    with ExitStack() as stack:
        worker = stack.enter_context(serving(tmp_path, _worker_args(1, "--config", str(options))))
        router = _router(stack, tmp_path, worker, tenancy, waitingQueuePolicy="priority")
        run = Run()
        flood, vip_client = _client(router, "flood"), _client(router, "vip")
        with ThreadPoolExecutor(max_workers=8) as pool:
            lows = [pool.submit(run.stream, flood, f"s{i}", served_name("upper"), max_tokens=64) for i in range(5)]
            wait_until(lambda: _engine_waiting(worker) >= 3, timeout_s=60)  # queued in the pod: no router limit
            vip = run.stream(vip_client, "vip", served_name("reverse"))
            for future in lows:
                assert future.result().error is None
    assert vip.first_token_s is not None
    # the pod runs one request at a time: the critical one is its next, ahead of those queued before it
    assert run.started_between("s", vip.sent_s, vip.first_token_s) <= 1
    assert _overtaken(run, vip) >= 2


def test_llmd_flow_control_starts_a_request_on_an_idle_pod(tmp_path: Path, worker: ServeProcess) -> None:
    """llm-d's utilization detector counts a pod whose load is unknown as saturated: an idle trtllm-serve pod (its
    ``/metrics`` an empty iteration list) must read as 0 waiting, or no request would ever start to make it known."""
    tenancy = {"order": "llmd-round-robin", "saturation": {"detector": "llmd-utilization"}}
    with ExitStack() as stack:
        router = _router(stack, tmp_path, worker, tenancy, scraped=True)
        fleet = router.router.fleets.fleets["tiny"]
        wait_until(lambda: [p.waiting_requests for p in fleet.snapshot().pods] == [0], timeout_s=30)
        first = Run().stream(_client(router, "steady"), "first", served_name("reverse"))
    assert first.error is None and first.first_token_s is not None


def _overtaken(run: Run, vip: Outcome) -> int:
    """Sheddable requests sent before ``vip`` whose first token came after its."""
    return sum(
        1
        for o in run.outcomes
        if o.name.startswith("s") and o.sent_s < vip.sent_s and (o.first_token_s or 0.0) > (vip.first_token_s or 0.0)
    )


def _engine_waiting(worker: ServeProcess) -> float:
    for line in worker.get("/prometheus/metrics").text.splitlines():
        if line.startswith("trtllm_num_requests_waiting"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0
