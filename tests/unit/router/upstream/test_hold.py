"""Holding requests while a base model has no ready pod: the hold unit alone, then the dispatcher against
echo upstreams whose only pod leaves and comes back (a scale from zero)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import openai
import pytest
from trtfleet_router.discovery.static import FleetConfig, snapshot_from_config
from trtfleet_router.peering.peers import PeerSettings
from trtfleet_router.routing import RoutingConfig
from trtfleet_router.upstream.hold import HoldsFull, PodHolds, fleet_budget

from tests.unit.router.harness import EchoFleet


def test_holders_are_released_together_when_pods_change() -> None:
    async def scenario() -> tuple[list[bool], int]:
        holds = PodHolds(max_held=4)
        waiters = [asyncio.create_task(holds.wait("tiny", 30)) for _ in range(3)]
        while holds.held("tiny") < 3:
            await asyncio.sleep(0)
        holds.pods_changed({"other"})  # another base model's pods: nobody wakes
        await asyncio.sleep(0)
        assert holds.held("tiny") == 3
        holds.pods_changed({"tiny"})
        return list(await asyncio.gather(*waiters)), holds.held("tiny")

    released, left = asyncio.run(scenario())
    assert released == [True, True, True] and left == 0


def test_a_hold_ends_at_its_limit_and_a_full_queue_refuses_at_once() -> None:
    async def scenario() -> bool:
        holds = PodHolds(max_held=1)
        first = asyncio.create_task(holds.wait("tiny", 0.05))
        while holds.held("tiny") < 1:
            await asyncio.sleep(0)
        with pytest.raises(HoldsFull):
            await holds.wait("tiny", 30)
        return await first

    assert asyncio.run(scenario()) is False


def test_the_first_request_held_starts_an_episode_and_wakes_who_waits_for_one() -> None:
    async def scenario() -> None:
        holds = PodHolds(max_held=4)
        assert holds.episode("tiny") == 0
        watch = asyncio.create_task(holds.wait_episode("tiny", 0, 30))
        quiet = asyncio.create_task(holds.wait_episode("other", 0, 0.05))
        first = asyncio.create_task(holds.wait("tiny", 30))
        assert await asyncio.wait_for(watch, 5) == 1  # woken by the first held request
        second = asyncio.create_task(holds.wait("tiny", 30))
        while holds.held("tiny") < 2:
            await asyncio.sleep(0)
        assert holds.episode("tiny") == 1  # joined a running episode: no new one
        assert await quiet == 0  # another base model's episode does not end its wait
        holds.pods_changed({"tiny"})
        assert await first and await second
        # held again after all were released: a new episode, numbered on the router's one sequence
        third = asyncio.create_task(holds.wait("tiny", 0.05))
        assert await holds.wait_episode("tiny", 1, 5) == 2
        assert await third is False
        assert await holds.wait_episode("tiny", 2, 0.01) == 2  # nothing new: the wait runs out
        # more held than a watcher's decision covered ends its wait, within the same episode
        fourth = asyncio.create_task(holds.wait("tiny", 30))
        assert await holds.wait_episode("tiny", 2, 5) == 3
        more = asyncio.create_task(holds.wait_episode("tiny", 3, 30, above=1))
        await asyncio.sleep(0.01)
        assert not more.done()  # one held, one covered
        fifth = asyncio.create_task(holds.wait("tiny", 30))
        assert await asyncio.wait_for(more, 5) == 3 and holds.held("tiny") == 2
        holds.pods_changed({"tiny"})
        assert await fourth and await fifth

    asyncio.run(scenario())


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=30) as response:
        return json.loads(response.read())


def test_the_peer_port_answers_held_requests_and_long_polls_for_the_next_episode(tmp_path: Path) -> None:
    echo = EchoFleet(tmp_path, count=1, routing=RoutingConfig(hold_wait_s=30), peering=PeerSettings(port=0))
    try:
        held_url = f"http://127.0.0.1:{echo.router.router.peer_port}/fleet/v1/held?base_model=tiny"
        nothing = _get_json(held_url)
        replica = nothing["replica"]
        assert nothing == {"replica": replica, "base_model": "tiny", "held": 0, "episode": 0}
        _set_backends(echo, present=False)
        results: list[str] = []
        errors: list[BaseException] = []
        polled: list[Any] = []
        poll = threading.Thread(
            target=lambda: polled.append(_get_json(f"{held_url}&after=0&wait=30&replica={replica}"))
        )
        poll.start()
        asked = _ask(echo, results, errors)
        poll.join(timeout=30)  # answered by the held request, not by the 30 s wait
        assert polled == [{"replica": replica, "base_model": "tiny", "held": 1, "episode": 1}]
        began = time.monotonic()
        assert _get_json(f"{held_url}&after=1&wait=0.3&replica={replica}")["episode"] == 1  # ran out, nothing new
        assert time.monotonic() - began >= 0.3
        # more held than the caller's decision covered (0) is answered at once too
        assert _get_json(f"{held_url}&after=1&wait=30&replica={replica}&above=0")["held"] == 1
        # a cursor from another replica (this address restarted) is answered at once
        assert _get_json(f"{held_url}&after=5&wait=30&replica=gone")["held"] == 1
        _set_backends(echo, present=True)
        asked.join(timeout=20)
        assert errors == [] and len(results) == 1
        assert _get_json(held_url)["held"] == 0
        with pytest.raises(urllib.error.HTTPError) as refused:
            _get_json(held_url.replace("base_model=tiny", "base_model=tiny&after=x&wait=1"))
        assert refused.value.code == 400
    finally:
        echo.close()


class _Paced:
    """Held requests of ``tiny`` under a budget of ``room`` in flight; a released request starts at once."""

    def __init__(self, room: int, held: int) -> None:
        self.room = room
        self.inflight = 0
        self.order: list[int] = []
        self.holds = PodHolds(max_held=16, budget=lambda _base: self.room - self.inflight)
        self.tasks = [asyncio.create_task(self._request(i)) for i in range(held)]

    async def _request(self, index: int) -> None:
        if await self.holds.wait("tiny", 30):
            self.inflight += 1  # as the dispatcher starts its ticket in the same step
            self.order.append(index)

    async def settle(self, count: int) -> None:
        while len(self.order) < count:
            await asyncio.sleep(0)


def test_the_routers_budget_is_per_ready_pod_less_what_is_in_flight(tmp_path: Path) -> None:
    echo = EchoFleet(tmp_path, count=1, routing=RoutingConfig(hold_wait_s=30, hold_release_per_pod=2.5))
    try:
        budget = fleet_budget(echo.router.router.fleets)

        async def read() -> tuple[int | None, int | None]:
            return budget("tiny"), budget("unknown")

        assert echo.loop.run(read()) == (2, 0)  # floor(2.5 x 1 ready pod), 0 for a base model not discovered
        _set_backends(echo, present=False)
        assert echo.loop.run(read()) == (0, 0)
    finally:
        echo.close()


def test_held_requests_are_released_oldest_first_within_the_budget() -> None:
    async def scenario() -> None:
        paced = _Paced(room=2, held=5)
        while paced.holds.held("tiny") < 5:
            await asyncio.sleep(0)
        paced.holds.pods_changed({"tiny"})  # a pod turned ready: room for 2
        await paced.settle(2)
        for _ in range(3):
            await asyncio.sleep(0)
        assert paced.order == [0, 1] and paced.holds.held("tiny") == 3
        paced.inflight -= 1  # one ended here: the next goes
        paced.holds.capacity_freed("tiny")
        await paced.settle(3)
        assert paced.order == [0, 1, 2]
        paced.inflight -= 1  # one ended on another replica: nobody is told, the re-check lets the next go
        await asyncio.wait_for(paced.settle(4), timeout=10)
        assert paced.order == [0, 1, 2, 3] and paced.holds.held("tiny") == 1
        paced.tasks[4].cancel()  # the client went away: it leaves the queue
        await asyncio.gather(*paced.tasks, return_exceptions=True)
        assert paced.holds.held("tiny") == 0 and not paced.holds._bases

    asyncio.run(scenario())


def test_a_released_turn_that_is_cancelled_passes_to_the_next() -> None:
    async def scenario() -> None:
        paced = _Paced(room=1, held=2)
        while paced.holds.held("tiny") < 2:
            await asyncio.sleep(0)
        paced.holds.pods_changed({"tiny"})  # the first is released ...
        paced.tasks[0].cancel()  # ... and cancelled before it resumes
        await asyncio.gather(paced.tasks[0], return_exceptions=True)
        assert paced.holds.held("tiny") == 0  # its turn went to the second at once, not at the next re-check
        await paced.settle(1)
        assert paced.order == [1]
        await asyncio.gather(*paced.tasks, return_exceptions=True)
        assert not paced.holds._bases

    asyncio.run(scenario())


def _eventually(check: Callable[[], bool], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def _set_backends(echo: EchoFleet, present: bool) -> None:
    fleet = {"baseModels": [{**echo.fleet["baseModels"][0]} | ({} if present else {"backends": []})]}
    snapshot = snapshot_from_config(FleetConfig.model_validate(fleet))

    async def apply() -> None:
        echo.router.router.fleets.apply(snapshot)

    echo.loop.run(apply())


def _ask(echo: EchoFleet, results: list[str], errors: list[BaseException]) -> threading.Thread:
    client = openai.OpenAI(base_url=echo.router.http_url + "/v1", api_key="unused", max_retries=0)

    def run() -> None:
        try:
            results.append(client.completions.create(model="a1", prompt="p", max_tokens=8).choices[0].text)
        except openai.APIError as exc:
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


@pytest.mark.parametrize("per_pod", [8.0, 1.0, 0.0], ids=["all-within-budget", "one-at-a-time", "unpaced"])
def test_a_request_held_at_zero_pods_is_answered_when_a_pod_is_ready(tmp_path: Path, per_pod: float) -> None:
    echo = EchoFleet(tmp_path, count=1, routing=RoutingConfig(hold_wait_s=30, hold_release_per_pod=per_pod))
    try:
        _set_backends(echo, present=False)
        results: list[str] = []
        errors: list[BaseException] = []
        threads = [_ask(echo, results, errors) for _ in range(3)]
        metrics = echo.router.router.metrics
        _eventually(lambda: metrics.held_requests.labels("tiny").value == 3)
        assert metrics.base_model_requests.labels("tiny").value == 3  # held requests are demand
        _set_backends(echo, present=True)  # a pod became ready
        for thread in threads:
            thread.join(timeout=20)
        assert errors == [] and results == ["[101] p"] * 3
        assert metrics.holds.labels("tiny", "released").value == 3
        assert metrics.held_requests.labels("tiny").value == 0
        _eventually(lambda: metrics.base_model_requests.labels("tiny").value == 0)
        assert metrics.adapter_requests.labels("tiny", "a1").value == 3
        assert metrics.activity.active("tiny").count == 1
        assert metrics.activity.in_flight("tiny") == 0  # all three answered: no adapter page needed now
        assert metrics.activity.active("tiny").pages == 0
        echo.router.check_books()
    finally:
        echo.close()


@pytest.mark.parametrize(
    ("routing", "counter"),
    [
        pytest.param(RoutingConfig(hold_wait_s=0.2), "timed_out", id="hold-times-out"),
        pytest.param(RoutingConfig(hold_wait_s=30, hold_queue_max=0), "queue_full", id="holds-full"),
    ],
)
def test_a_hold_that_runs_out_answers_503_with_retry_after(
    tmp_path: Path, routing: RoutingConfig, counter: str
) -> None:
    echo = EchoFleet(tmp_path, count=1, routing=routing)
    try:
        _set_backends(echo, present=False)
        results: list[str] = []
        errors: list[BaseException] = []
        _ask(echo, results, errors).join(timeout=20)
        assert results == [] and len(errors) == 1
        error = errors[0]
        assert isinstance(error, openai.APIStatusError) and error.status_code == 503
        assert error.response.headers["Retry-After"] == "5" and "no ready pod" in str(error)
        assert echo.router.router.metrics.holds.labels("tiny", counter).value == 1
    finally:
        echo.close()


def test_without_a_hold_no_pod_is_503_at_once(tmp_path: Path) -> None:
    echo = EchoFleet(tmp_path, count=1)
    try:
        _set_backends(echo, present=False)
        results: list[str] = []
        errors: list[BaseException] = []
        _ask(echo, results, errors).join(timeout=20)
        assert isinstance(errors[0], openai.APIStatusError) and errors[0].status_code == 503
        assert echo.router.router.metrics.held_requests.labels("tiny").value == 0
    finally:
        echo.close()
