"""The scheduler thread: concurrent submissions, client cancellation and shutdown."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
from trtfleet_engines.reference.loop import UNLOADING_TEXT, EngineLoop
from trtfleet_engines.reference.scheduler import BatcherStats, EngineResponse, InflightBatcher

from tests.unit.reference.fakes import FakeModel, limits, request


@dataclass(eq=False)
class Client:
    name: str
    cancelled: bool = False


class Inbox:
    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.responses: list[EngineResponse[Client]] = []

    def deliver(self, responses: list[EngineResponse[Client]]) -> None:
        with self.cond:
            self.responses += responses
            self.cond.notify_all()

    def wait_for(self, predicate: Callable[[list[EngineResponse[Client]]], bool], timeout_s: float = 10.0) -> None:
        with self.cond:
            assert self.cond.wait_for(lambda: predicate(self.responses), timeout_s), self.responses[-5:]

    def finals(self) -> dict[str, EngineResponse[Client]]:
        with self.cond:
            return {r.handle.name: r for r in self.responses if r.final}


@pytest.fixture
def running() -> Iterator[tuple[EngineLoop[Client], Inbox, list[BatcherStats]]]:
    inbox = Inbox()
    stats: list[BatcherStats] = []
    batcher: InflightBatcher[Client] = InflightBatcher(FakeModel(), limits(max_seq_len=10**9))
    loop = EngineLoop(
        batcher,
        inbox.deliver,
        is_cancelled=lambda c: c.cancelled,
        on_stats=stats.append,
        cancellation_period_s=0.0,
        stats_period_s=0.01,
    )
    loop.start()
    yield loop, inbox, stats
    loop.stop()
    assert loop.stats().active_requests == 0 and loop.stats().waiting_requests == 0


def test_concurrent_submissions_each_get_one_final_response(running) -> None:  # type: ignore[no-untyped-def]
    loop, inbox, stats = running
    clients = [Client(f"c{i}") for i in range(12)]
    threads = [threading.Thread(target=loop.submit, args=(request([i], 5), c)) for i, c in enumerate(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    inbox.wait_for(lambda rs: sum(r.final for r in rs) == len(clients))
    finals = inbox.finals()
    assert {name: r.output_ids[-1] for name, r in finals.items()} == {f"c{i}": i + 5 for i in range(12)}
    deadline = time.monotonic() + 5
    while not stats or stats[-1].active_requests:  # the idle loop keeps reporting
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert stats[-1].iterations > 0


def test_a_client_cancellation_ends_the_request(running) -> None:  # type: ignore[no-untyped-def]
    loop, inbox, _ = running
    client = Client("forever")
    loop.submit(request([1], 10**9, streaming=True), client)
    inbox.wait_for(lambda rs: len(rs) >= 3)
    client.cancelled = True
    inbox.wait_for(lambda rs: any(r.final for r in rs))
    assert inbox.finals()["forever"].output_ids == ()


def test_stop_fails_what_is_left() -> None:
    inbox = Inbox()
    batcher: InflightBatcher[Client] = InflightBatcher(FakeModel(), limits(max_seq_len=10**9))
    loop = EngineLoop(batcher, inbox.deliver)
    loop.start()
    loop.submit(request([1], 10**9, streaming=True), Client("forever"))
    inbox.wait_for(lambda rs: len(rs) >= 2)
    loop.stop()
    assert inbox.finals()["forever"].error == UNLOADING_TEXT


def test_min_step_time_sleeps_the_remainder_outside_the_lock() -> None:
    inbox = Inbox()
    now = [0.0]
    slept: list[float] = []

    def clock() -> float:
        now[0] += 0.001  # every clock read advances 1 ms
        return now[0]

    batcher: InflightBatcher[Client] = InflightBatcher(FakeModel(), limits())
    loop = EngineLoop(batcher, inbox.deliver, clock=clock, sleep=slept.append, min_step_s=0.010)
    loop.start()
    loop.submit(request([1], 3), Client("a"))
    inbox.wait_for(lambda rs: any(r.final for r in rs))
    loop.stop()
    assert slept and all(0 < s < 0.010 for s in slept)


def test_prefill_time_is_charged_per_prompt_position_before_the_first_token() -> None:
    """A step that prefills 5 prompt positions lasts 5 x the per-token time longer, and its token comes out
    after that part (the rest of the minimum step after it); decode steps pay only the minimum step."""
    now = [0.0]
    events: list[tuple[str, float]] = []

    def sleep(seconds: float) -> None:
        events.append(("sleep", round(seconds, 9)))
        now[0] += seconds

    class Recording(Inbox):
        def deliver(self, responses: list[EngineResponse[Client]]) -> None:
            events.append(("deliver", round(now[0], 9)))
            super().deliver(responses)

    inbox = Recording()
    batcher: InflightBatcher[Client] = InflightBatcher(FakeModel(), limits())
    loop = EngineLoop(
        batcher, inbox.deliver, clock=lambda: now[0], sleep=sleep, min_step_s=0.010, prefill_s_per_token=0.001
    )
    loop.start()
    loop.submit(request([1, 2, 3, 4, 5], 2, streaming=True), Client("a"))
    inbox.wait_for(lambda rs: any(r.final for r in rs))
    loop.stop()
    # the frozen clock moves only by the pretend sleeps: prefill (5 ms), first token, rest of the step (10 ms),
    # then a decode step of 10 ms
    assert events[:4] == [("sleep", 0.005), ("deliver", 0.005), ("sleep", 0.01), ("deliver", 0.015)]
    assert batcher.computed_prompt_tokens == batcher.stats().prefill_tokens_computed == 5


def test_an_idle_engine_makes_no_calls_to_triton() -> None:
    """Metric updates or is_cancelled calls while Triton unloads the model hang the Python stub forever."""
    inbox = Inbox()
    calls: list[str] = []
    batcher: InflightBatcher[Client] = InflightBatcher(FakeModel(), limits())
    loop = EngineLoop(
        batcher,
        inbox.deliver,
        is_cancelled=lambda c: calls.append("is_cancelled") or False,
        on_stats=lambda s: calls.append("stats"),
        cancellation_period_s=0.0,
        stats_period_s=0.0,
    )
    loop.start()
    loop.submit(request([1], 5), Client("a"))
    inbox.wait_for(lambda rs: any(r.final for r in rs))
    settled = len(calls)
    deadline = time.monotonic() + 0.3
    while time.monotonic() < deadline:  # an absence can only be checked over a window
        assert len(calls) <= settled + 1  # at most the report "became idle", already on its way
        time.sleep(0.01)
    loop.stop()
    assert "stats" in calls and "is_cancelled" in calls


def test_an_adapter_copy_and_its_weights_cost_what_a_gpu_pod_pays() -> None:
    """With a pretend PCIe bandwidth a step that copies an adapter to the device tier lasts its pages' bytes over it
    longer, before the token comes out; with a pretend network a request carrying weights is fetched only once
    they crossed the link, while a request without weights passes at once. Lower bounds only: they hold however
    slow the machine is."""
    from tests.unit.reference.fakes import PAGE_BYTES, adapter_store, lora

    inbox = Inbox()
    delivered: dict[str, float] = {}
    started = time.monotonic()

    def deliver(responses: list[EngineResponse[Client]]) -> None:
        for response in responses:
            delivered.setdefault(response.handle.name, time.monotonic() - started)
        inbox.deliver(responses)

    store, _ = adapter_store(host_pages=3, device_pages=3)
    batcher: InflightBatcher[Client] = InflightBatcher(FakeModel(), limits(), store)
    with_weights = lora(7, 1)
    assert with_weights.weights is not None
    transfer_s, copy_s_per_page = 0.3, 0.1
    loop = EngineLoop(batcher, deliver, host_to_device_bytes_per_s=PAGE_BYTES / copy_s_per_page,
                      network_bytes_per_s=with_weights.weights.nbytes / transfer_s)
    loop.start()
    loop.submit(request([1], 1, lora=with_weights), Client("weights"))
    loop.submit(request([2], 1), Client("base"))  # no weights: not held behind the transfer
    inbox.wait_for(lambda rs: sum(r.final for r in rs) == 2)
    loop.stop()
    pages = store.cache.host.pages_of(7)
    assert delivered["weights"] >= transfer_s + copy_s_per_page * pages
    assert delivered["base"] < delivered["weights"]
    assert store.copied_bytes_total == pages * PAGE_BYTES
