"""The operator's long poll of the routers' held requests (scale from zero at once): the pure answer rules,
then :class:`HoldWatch` against a real router (echo upstreams) whose only pod leaves: a held request makes
the watch decide within a second, not at the next autoscaling tick."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import openai
import pytest
from trtfleet_operator.config import AutoscaleConfig, MergeAdviceConfig
from trtfleet_operator.holdwatch import Cursor, HeldAnswer, HoldWatch, advance, covered_by, is_new, parse_held
from trtfleet_router.discovery.static import FleetConfig, snapshot_from_config
from trtfleet_router.peering.peers import PeerSettings
from trtfleet_router.routing import RoutingConfig

from tests.unit.router.harness import EchoFleet


@pytest.mark.parametrize(
    ("answer", "cursor", "new"),
    [
        pytest.param(HeldAnswer("r1", 0, 0), None, False, id="first-contact-nothing-held"),
        pytest.param(HeldAnswer("r1", 2, 1), None, True, id="first-contact-holds-requests"),
        pytest.param(HeldAnswer("r1", 2, 1), Cursor("r1", 1), False, id="same-episode-already-acted-on"),
        pytest.param(HeldAnswer("r1", 1, 2), Cursor("r1", 1), True, id="a-new-episode"),
        pytest.param(HeldAnswer("r1", 0, 2), Cursor("r1", 1), False, id="a-new-episode-already-over"),
        pytest.param(HeldAnswer("r2", 1, 1), Cursor("r1", 7), True, id="restarted-router-holds-requests"),
        pytest.param(HeldAnswer("r1", 8, 1), Cursor("r1", 1, 8), False, id="backlog-within-what-was-decided"),
        pytest.param(HeldAnswer("r1", 9, 1), Cursor("r1", 1, 8), True, id="backlog-beyond-what-was-decided"),
    ],
)
def test_an_answer_is_acted_on_only_when_it_holds_requests_no_decision_covered(
    answer: HeldAnswer, cursor: Cursor | None, new: bool
) -> None:
    assert is_new(answer, cursor) is new


@pytest.mark.parametrize(
    ("held", "per_pod", "covered"),
    [(1, 8.0, 8), (8, 8.0, 8), (9, 8.0, 16), (3, 1.0, 3), (5, 2.5, 5), (6, 2.5, 7), (4, None, None)],
)
def test_a_decision_covers_its_held_requests_rounded_up_to_whole_pods(
    held: int, per_pod: float | None, covered: int | None
) -> None:
    assert covered_by(held, per_pod) == covered


def test_the_cursor_keeps_what_a_decision_covered_until_the_episode_ends() -> None:
    decided = advance(HeldAnswer("r1", 3, 1), None, True, 8.0)
    assert decided == Cursor("r1", 1, 8)
    assert advance(HeldAnswer("r1", 5, 1), decided, False, 8.0) == Cursor("r1", 1, 8)  # same episode
    assert advance(HeldAnswer("r1", 0, 1), decided, False, 8.0) == Cursor("r1", 1, None)  # released
    assert advance(HeldAnswer("r1", 2, 2), decided, False, 8.0) == Cursor("r1", 2, None)  # a new episode


@pytest.mark.parametrize(
    ("body", "parsed"),
    [
        ({"replica": "r", "base_model": "tiny", "held": 3, "episode": 2}, HeldAnswer("r", 3, 2)),
        ({"replica": "r", "held": "3", "episode": 2}, None),
        ({"base_models": {}}, None),
        ([], None),
    ],
)
def test_only_a_held_requests_answer_parses(body: Any, parsed: HeldAnswer | None) -> None:
    assert parse_held(body) == parsed


def _no_pods(echo: EchoFleet) -> None:
    snapshot = snapshot_from_config(FleetConfig.model_validate({"baseModels": [{**echo.fleet["baseModels"][0],
                                                                                 "backends": []}]}))

    async def apply() -> None:
        echo.router.router.fleets.apply(snapshot)

    echo.loop.run(apply())


def _wait_for(count: int, decisions: list[float]) -> None:
    deadline = time.monotonic() + 10  # a bound for a loaded machine; the answer comes in milliseconds
    while len(decisions) < count and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(decisions) == count, f"{len(decisions)} decisions, {count} expected"


def test_held_requests_make_the_watch_decide_at_once_whichever_router_holds_them(tmp_path: Path) -> None:
    """Two router replicas; requests are held on the second only. The first's long poll (30 s) never answers,
    and neither the first held request nor the backlog beyond what the first decision covered waits for it."""
    idle = EchoFleet(tmp_path / "a", count=1, routing=RoutingConfig(hold_wait_s=30), peering=PeerSettings(port=0))
    echo = EchoFleet(tmp_path / "b", count=1, routing=RoutingConfig(hold_wait_s=30), peering=PeerSettings(port=0))
    decisions: list[float] = []
    threads: list[threading.Thread] = []
    try:
        urls = tuple(f"http://127.0.0.1:{fleet.router.router.peer_port}/fleet/v1/demand" for fleet in (idle, echo))
        watch = HoldWatch(
            None,  # type: ignore[arg-type]  # fixed router URLs: the Kubernetes client is never called
            AutoscaleConfig(held_wait_s=30),
            MergeAdviceConfig(router_demand_urls=urls),
        )

        async def decide() -> None:
            decisions.append(time.monotonic())

        async def start() -> asyncio.Task[None]:
            return asyncio.create_task(watch.run("default", "tiny", decide, lambda: 1.0))

        task = echo.loop.run(start())
        _no_pods(idle)
        _no_pods(echo)
        time.sleep(1.5)  # the first contacts (nothing held) are done; both polls wait now
        assert decisions == []
        client = openai.OpenAI(base_url=echo.router.http_url + "/v1", api_key="unused", max_retries=0)
        errors: list[BaseException] = []

        def ask() -> None:
            try:
                client.completions.create(model="a1", prompt="p", max_tokens=8, timeout=8)
            except openai.APIError as exc:
                errors.append(exc)

        held_at = time.monotonic()
        threads.append(threading.Thread(target=ask))
        threads[-1].start()
        _wait_for(1, decisions)
        # printed, not asserted: the figure is a machine's (against up to one 15 s autoscaling interval)
        print(f"held -> decision: {decisions[0] - held_at:.3f} s")
        # one held request covered at 1 per pod; a second one is more than that: decided again, without
        # waiting for the idle replica's poll
        threads.append(threading.Thread(target=ask))
        threads[-1].start()
        _wait_for(2, decisions)

        async def stop() -> None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

        echo.loop.run(stop())
        for thread in threads:
            thread.join(timeout=30)
        assert len(errors) == 2 and all(isinstance(e, openai.APITimeoutError) for e in errors)  # no pod came
    finally:
        echo.close()
        idle.close()
