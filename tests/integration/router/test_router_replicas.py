"""Router replicas share one view of the pods' LoRA caches: real reference workers, real ``trtfleet router``
processes streaming their events to each other over the peer port.

* an adapter loaded through replica A is routed warm (no weights sent again) through replica B;
* a replica added mid-run with ``--peer <A>`` routes warm from its first request;
* a killed replica's pins are released on the others once its grace period ends;
* a conversation's first turn through one replica and its second through another land on the same pod (the
  KV-cache blocks each request leaves on its pod travel with the peer events);
* a batch run through one replica is counted as batch lines in the other's view (event format 2), not as
  interactive load.

The replicas share one token file (``--internal-token-file``), as the chart runs them; what a client without it
gets is in ``test_router_peer_auth.py``. Every wait is on a condition (a snapshot or a metric reaching a value),
bounded by a deadline.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.integration.router.replica_process import (
    GRACE_S,
    RouterProcess,
    logged,
    new_token_file,
    wait_for,
)
from tests.integration.router.support import ConvertedAdapter

pytestmark = pytest.mark.integration


def resident(router: RouterProcess, task_id: int) -> set[str]:
    """Pods whose cache holds ``task_id`` in ``router``'s view."""
    pods = router.snapshot()["fleets"]["tiny"]["pods"]
    return {pod["pod_id"] for pod in pods if any(task == task_id for task, _ in pod["resident"])}


def upstream_done(router: RouterProcess, request_id: str) -> list[dict[str, Any]]:
    """The ``upstream done`` debug lines of ``request_id`` (the router runs at DEBUG)."""
    return [line for line in logged(router, "upstream done") if line.get("request_id") == request_id]


def tickets_of(router: RouterProcess, origin: str) -> list[list[Any]]:
    return list(router.snapshot()["fleets"]["tiny"]["tickets"].get(origin, []))


@pytest.fixture
def routers(fleet_file: Path, tmp_path: Path) -> Iterator[Callable[..., RouterProcess]]:
    started: list[RouterProcess] = []
    token_file = new_token_file(tmp_path / "internal-tokens")

    def start(*peers: RouterProcess, log_level: str = "INFO", extra: tuple[str, ...] = ()) -> RouterProcess:
        log_file = tmp_path / f"router{len(started)}.log"
        peer_urls = tuple(p.peer_url for p in peers)
        router = RouterProcess(fleet_file, log_file, peer_urls, log_level, extra, token_file=token_file)
        started.append(router)
        return router

    yield start
    for router in started:
        with contextlib.suppress(Exception):
            router.stop()


def complete(router: RouterProcess, adapter: ConvertedAdapter, prompt: str = "hello") -> str:
    text = router.client().completions.create(model=adapter.name, prompt=prompt, max_tokens=4).choices[0].text
    assert isinstance(text, str)
    return text


def test_an_adapter_loaded_through_one_replica_is_warm_through_another(
    routers: Callable[..., RouterProcess], converted_adapters: list[ConvertedAdapter]
) -> None:
    a = routers()
    b = routers(a)
    wait_for(lambda: b.snapshot()["replica"] in a.snapshot()["watermarks"], "A follows B (it subscribed back)")
    adapter = converted_adapters[0]
    complete(a, adapter)
    assert a.counter("adapter_loads") == 1
    wait_for(lambda: bool(resident(b, adapter.task_id)), "B's view holds the adapter A loaded")
    assert resident(b, adapter.task_id) == resident(a, adapter.task_id)
    complete(b, adapter)
    assert b.counter("adapter_loads") == 0  # no weights sent again
    assert b.counter("adapter_cache_hits") == 1 and b.counter("adapter_cache_misses") == 0
    # and back: B's use is in A's view too (the LRU order follows both replicas' traffic)
    wait_for(lambda: a.snapshot()["fleets"] == b.snapshot()["fleets"], "the two views agree", 10)
    # the demand the autoscaler reads counts both replicas' requests, on either replica
    for router in (a, b):
        demand = router.demand()
        tiny = demand["base_models"]["tiny"]
        assert round(tiny["adapter_requests_per_s"][adapter.name] * demand["window_s"]) == 2
        assert tiny["adapters_active"] == 1 and tiny["inflight_requests"] == 0


def test_a_replica_added_mid_run_routes_warm_from_its_first_request(
    routers: Callable[..., RouterProcess], converted_adapters: list[ConvertedAdapter]
) -> None:
    a = routers()
    b = routers(a)
    for adapter in converted_adapters[:2]:
        complete(a, adapter)
    complete(b, converted_adapters[2])
    wait_for(lambda: bool(resident(a, converted_adapters[2].task_id)), "A's view holds what B loaded")
    c = routers(b)  # knows only B; served once it copied B's view
    for adapter in converted_adapters[:3]:
        complete(c, adapter)
    assert c.counter("adapter_loads") == 0
    assert c.counter("adapter_cache_hits") == 3 and c.counter("adapter_cache_misses") == 0
    # A never named C, yet C subscribed to A (from B's snapshot) and A to C (subscribed back)
    wait_for(lambda: c.snapshot()["replica"] in a.snapshot()["watermarks"], "A follows C")
    wait_for(lambda: a.snapshot()["replica"] in c.snapshot()["watermarks"], "C follows A")


def test_a_killed_replicas_pins_are_released_on_the_others(
    routers: Callable[..., RouterProcess], converted_adapters: list[ConvertedAdapter]
) -> None:
    a = routers()
    b = routers(a)
    adapter = converted_adapters[1]
    a_id = a.snapshot()["replica"]
    stream = a.client().completions.create(model=adapter.name, prompt="long", max_tokens=200, stream=True)
    pieces = iter(stream)
    next(pieces)  # the request is in flight on a pod, its adapter pinned
    seen: list[list[Any]] = []
    wait_for(lambda: bool(seen.extend(tickets_of(b, a_id)) or seen), "B's view holds A's request")
    assert [ticket[2] for ticket in seen] == [adapter.task_id]
    a.process.kill()
    started = time.monotonic()
    a.process.wait()
    wait_for(lambda: not tickets_of(b, a_id), "B released the killed replica's pins", 10 + GRACE_S)
    assert adapter.task_id in {task for pod in b.snapshot()["fleets"]["tiny"]["pods"] for task, _ in pod["resident"]}
    with contextlib.suppress(openai.APIError, openai.APIConnectionError):
        for _ in pieces:
            pass
    # the pin was released by the grace period, not by the request's end (which A never published)
    assert time.monotonic() - started >= GRACE_S


def test_a_triton_restart_in_its_pod_empties_every_replicas_view_without_a_miss(
    routers: Callable[..., RouterProcess], workers: list[Any], converted_adapters: list[ConvertedAdapter]
) -> None:
    a = routers()
    b = routers(a, log_level="DEBUG")
    adapter = converted_adapters[2]
    complete(a, adapter)
    complete(a, adapter, "again")
    (pod,) = resident(a, adapter.task_id)
    wait_for(lambda: resident(b, adapter.task_id) == {pod}, "B's view holds the adapter too")
    workers[int(pod.removeprefix("w"))].restart()  # same ports, same pod id and uid: an empty LoRA cache
    for router in (a, b):
        wait_for(lambda router=router: pod not in resident(router, adapter.task_id), "the view of the pod is reset")
    text = b.client().completions.create(
        model=adapter.name, prompt="after the restart", max_tokens=4, extra_headers={"X-Request-Id": "after-restart"}
    )
    assert isinstance(text.choices[0].text, str)
    assert b.counter("adapter_cache_misses") == 0 and a.counter("adapter_cache_misses") == 0
    # Its answering attempt carried the weights, or went where a replica's warm start had pushed them since the
    # restart: the probes ejected the pod while Triton was down, and readmitting it warms it with the hot adapter
    # (so B's adapter_loads is not exact here: either replica may readmit it, before or after this request).
    wait_for(lambda: bool(upstream_done(b, "after-restart")), "B logged the request's attempt")
    (attempt,) = upstream_done(b, "after-restart")
    if not attempt["send_weights"]:
        assert attempt["pod"] == pod

        def prewarmed() -> bool:
            lines = logged(a, "prewarmed") + logged(b, "prewarmed")
            return any(line["pod"] == pod and line["adapter"] == adapter.name for line in lines)

        wait_for(prewarmed, "a replica logged the warm start that put the adapter back on the pod")


def test_two_replicas_send_a_conversations_next_turn_to_the_pod_holding_its_prefix(
    routers: Callable[..., RouterProcess],
) -> None:
    a = routers()
    b = routers(a)
    wait_for(lambda: b.snapshot()["replica"] in a.snapshot()["watermarks"], "A follows B (it subscribed back)")
    for conversation in range(3):  # base-model requests: every pod is warm, only the prefix tells them apart
        first = f"turn one of chat {conversation}: " + "the replicas share the prefix " * 2  # 2 full blocks
        second = first + "and the next turn goes there too"  # 3 full blocks, the first two shared
        assert len(second.encode()) <= 126  # the reference engine's prompt limit
        wait_for(lambda: a.settled() and b.settled(), "no request in flight")
        before = a.kv_blocks_held()
        wait_for(lambda before=before: b.kv_blocks_held() == before, "the two prefix indexes agree")
        a.client().completions.create(model="tiny", prompt=first, max_tokens=2)
        wait_for(lambda: a.settled(), "A's first turn ended")
        after_first = a.kv_blocks_held()
        (holder,) = [pod for pod in before if after_first[pod] != before[pod]]
        wait_for(lambda after_first=after_first: b.kv_blocks_held() == after_first, "B's index holds A's blocks")
        b.client().completions.create(model="tiny", prompt=second, max_tokens=2)
        wait_for(lambda: b.settled(), "B's second turn ended")
        after_second = b.kv_blocks_held()
        grown = [pod for pod in before if after_second[pod] != after_first[pod]]
        assert grown == [holder], (after_first, after_second)
        wait_for(lambda after_second=after_second: a.kv_blocks_held() == after_second, "A's index follows B's turn")


def test_another_replicas_batch_lines_are_known_as_batch_lines(
    routers: Callable[..., RouterProcess], converted_adapters: list[ConvertedAdapter], tmp_path: Path
) -> None:
    a = routers(extra=("--batch-store", str(tmp_path / "store"), "--batch-concurrency", "4"))
    b = routers(a)
    names = ["tiny", *(adapter.name for adapter in converted_adapters)]
    rows = [
        {"custom_id": f"line-{i}", "method": "POST", "url": "/v1/completions",
         "body": {"model": names[i % len(names)], "prompt": f"line {i}", "max_tokens": 16, "temperature": 0}}
        for i in range(40)
    ]  # fmt: skip
    client = a.client()
    jsonl = "".join(json.dumps(row) + "\n" for row in rows).encode()
    upload = client.files.create(file=("in.jsonl", jsonl), purpose="batch")
    batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/completions", completion_window="24h")
    seen: list[tuple[int, int]] = []

    def b_sees_batch_lines() -> bool:
        pods = b.pods()
        lines, inflight = sum(p["remote_batch_lines"] for p in pods), sum(p["remote_inflight"] for p in pods)
        seen.append((lines, inflight))
        return lines > 0

    # B learns that A's requests are batch lines (event format 2): they are out of its interactive load
    wait_for(b_sees_batch_lines, "B's view counts A's requests as batch lines", 60)
    assert all(lines <= inflight for lines, inflight in seen)
    wait_for(lambda: client.batches.retrieve(batch.id).status == "completed", "the batch completed", 120)
    wait_for(lambda: not any(p["remote_inflight"] or p["remote_batch_lines"] for p in b.pods()), "B saw them end")
