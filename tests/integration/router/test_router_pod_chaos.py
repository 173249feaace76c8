"""One of three real reference workers killed, frozen or broken under load: no client sees an error for a
request that had no token yet, no stream hangs (each ends within its timeouts), the pod is ejected.

* kill: SIGKILL of the worker's tritonserver (its connections are refused or reset);
* freeze: SIGSTOP of tritonserver and its Python stubs until the router has ejected it, then SIGCONT (it
  accepts connections but answers nothing: the stream timeouts and the readiness probe find it);
* break: SIGKILL of the worker's ``tensorrt_llm_bls`` Python stub (tritonserver answers every request with
  ``Stub process ... is not healthy``).

Load: six client threads, each sending streamed and unary completions (base model and adapters) with the
official openai client until enough requests succeeded after the event. The figures (errors, time to
eject, retries) are printed for the record; only behaviour is asserted.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai
import pytest
from trtfleet_router.routing.config import RoutingConfig, StreamTimeouts
from trtfleet_router.routing.outlier import OutlierDetectionConfig

from tests.integration.router.support import ConvertedAdapter, reference_workers, router_for
from tests.unit.router.harness import RouterThread

pytestmark = pytest.mark.integration

STEP_MS = 25.0  # a pretend GPU step: a 24-token answer takes about 0.6 s
MAX_TOKENS = 24
FIRST_TOKEN_S = 4.0
INTER_TOKEN_S = 2.0
CLIENTS = 6
AFTER_EVENT_OK = 40  # successful requests after the event before the load stops
VICTIM = 1
ROUTING = RoutingConfig(
    outlier_detection=OutlierDetectionConfig(
        consecutive_failures=2, base_ejection_time_s=3.0, probe_interval_s=0.5, probe_timeout_s=2.0
    ),
    stream_timeouts=StreamTimeouts(first_token_s=FIRST_TOKEN_S, inter_token_s=INTER_TOKEN_S),
)


def _children(pid: int) -> list[int]:
    """Every descendant of ``pid`` (from /proc)."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        parents.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def _bls_stub(worker: Any) -> int:
    stubs = [
        pid
        for pid in _children(worker.pid)
        if "triton_python_backend_stub" in _cmdline(pid)[0] and any("tensorrt_llm_bls" in a for a in _cmdline(pid))
    ]
    assert len(stubs) == 1, f"expected one tensorrt_llm_bls stub, found {stubs}"
    return stubs[0]


@dataclass
class Outcome:
    model: str
    stream: bool
    ok: bool
    tokens_before_error: int
    error: str
    started_s: float
    took_s: float


@dataclass
class Load:
    """Client threads sending requests until ``stop``; every request's outcome is recorded."""

    client: openai.OpenAI
    models: list[str]
    expected: dict[str, str]
    outcomes: list[Outcome] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def one(self, index: int) -> None:
        model = self.models[index % len(self.models)]
        stream = index % 2 == 0
        started = time.monotonic()
        text, error = "", ""
        try:
            if stream:
                for chunk in self.client.completions.create(
                    model=model, prompt="keep going", max_tokens=MAX_TOKENS, stream=True
                ):
                    text += chunk.choices[0].text if chunk.choices else ""
            else:
                text = (
                    self.client.completions.create(model=model, prompt="keep going", max_tokens=MAX_TOKENS)
                    .choices[0]
                    .text
                )
        except openai.APIError as exc:
            error = f"{type(exc).__name__}: {exc}"
        ok = not error and text == self.expected[model]
        if not error and not ok:
            error = f"wrong text {text!r}"
        outcome = Outcome(model, stream, ok, len(text), error, started, time.monotonic() - started)
        with self.lock:
            self.outcomes.append(outcome)

    def run(self, worker: int) -> None:
        index = worker
        while not self.stop.is_set():
            self.one(index)
            index += CLIENTS

    def succeeded_after(self, at_s: float) -> int:
        with self.lock:
            return sum(1 for o in self.outcomes if o.ok and o.started_s > at_s)


def _eventually(check: Callable[[], bool], timeout_s: float, what: str) -> float:
    """Seconds until ``check`` held (fails after ``timeout_s``)."""
    started = time.monotonic()
    while not check():
        assert time.monotonic() - started < timeout_s, f"{what}: not reached in {timeout_s} s"
        time.sleep(0.02)
    return time.monotonic() - started


def _inflight(router: RouterThread) -> dict[str, int]:
    url = router.metrics_url.replace("/metrics", "/debug/fleets")
    debug = json.loads(urllib.request.urlopen(url, timeout=10).read())
    return {pod["pod_id"]: pod["inflight"] for pod in debug["tiny"]["pods"]}


def _metric_lines(router: RouterThread, prefix: str) -> list[str]:
    text = urllib.request.urlopen(router.metrics_url, timeout=10).read().decode()
    return [line for line in text.splitlines() if line.startswith(prefix)]


@pytest.mark.parametrize("event", ["kill", "freeze", "break"])
def test_one_worker_killed_frozen_or_broken_under_load(converted_adapters: list[ConvertedAdapter], event: str) -> None:
    with (
        reference_workers(min_step_ms=STEP_MS) as workers,
        router_for(workers, converted_adapters, routing=ROUTING) as router,
    ):
        client = openai.OpenAI(base_url=router.http_url + "/v1", api_key="unused", max_retries=0, timeout=120)
        models = ["tiny"] + [a.name for a in converted_adapters]
        expected = {
            m: client.completions.create(model=m, prompt="keep going", max_tokens=MAX_TOKENS).choices[0].text
            for m in models
        }
        load = Load(client, models, expected)
        threads = [threading.Thread(target=load.run, args=(i,), daemon=True) for i in range(CLIENTS)]
        for thread in threads:
            thread.start()
        victim, victim_pod = workers[VICTIM], f"w{VICTIM}"
        _eventually(lambda: _inflight(router).get(victim_pod, 0) >= 1, 60, "requests in flight on the victim")

        fleets = router.router.fleets
        event_at = time.monotonic()
        stopped: list[int] = []
        if event == "kill":
            doomed = _children(victim.pid)  # the whole pod dies: tritonserver and its stubs
            victim.process.kill()
            for pid in doomed:
                os.kill(pid, signal.SIGKILL)
        elif event == "break":
            os.kill(_bls_stub(victim), signal.SIGKILL)
        else:
            stopped = [victim.pid, *_children(victim.pid)]
            for pid in stopped:
                os.kill(pid, signal.SIGSTOP)
        try:
            eject_s = _eventually(lambda: victim_pod in fleets.ejected("tiny"), 60, "the victim ejected")
        finally:
            for pid in reversed(stopped):
                os.kill(pid, signal.SIGCONT)
        _eventually(lambda: load.succeeded_after(event_at + eject_s) >= AFTER_EVENT_OK, 120, "load after the event")
        load.stop.set()
        for thread in threads:
            thread.join(120)
            assert not thread.is_alive(), "a client thread hung"

        failed = [o for o in load.outcomes if not o.ok]
        before_token = [o for o in failed if o.tokens_before_error == 0]
        retries = _metric_lines(router, "trtfleet_router_upstream_retries_total")
        print(
            f"\n{event}: {len(load.outcomes)} requests, {len(failed)} client errors "
            f"({len(before_token)} before a token), ejected after {eject_s:.2f} s, "
            f"slowest request {max(o.took_s for o in load.outcomes):.2f} s; {retries}"
        )
        retried = sum(
            float(line.rsplit(" ", 1)[1])
            for line in retries
            if 'reason="pod_failed"' in line or 'reason="stalled"' in line
        )
        assert retried > 0  # requests really were on the victim and were retried: the test is not vacuous
        assert before_token == [], before_token[:3]
        assert all(o.stream and "broke after it started" in o.error for o in failed), failed[:3]
        bound_s = FIRST_TOKEN_S + MAX_TOKENS * INTER_TOKEN_S  # the longest a request may wait on one pod
        assert all(o.took_s < 2 * bound_s for o in load.outcomes)  # nothing waited for the 600 s deadline
