"""The stub recorder's log, and which stubs the watchdog counts as dead."""

from __future__ import annotations

import signal

import pytest
from trtfleet_engines.reference.stubs import StubRecord, read_stub_log
from trtfleet_engines.reference.supervisor import StubWatchdog, dead_stubs

LOG = """start 10 11 tensorrt_llm_0_0 /r/models/tensorrt_llm 100.0
start 20 21 tensorrt_llm_bls_0_0 /r/models/tensorrt_llm_bls 100.5
start 30 31 preprocessing_0_0 /r/models/preprocessing 101.0
exit 20 21 tensorrt_llm_bls_0_0 /r/models/tensorrt_llm_bls 150.0 9
exit 10 11 tensorrt_llm_0_0 /r/models/tensorrt_llm 160.0 0
start 40 41 tensorrt_llm_bls_0_0 /r/models/tensorrt_llm_bls 170.0
exit 40 41 tensorrt_llm_bls_0_0 /r/models/tensorrt_llm_bls 180.0 139
start 50 51 postprocessing_0_0 /r/models/postprocessing 190.0
exit 50 51 postprocessing_0_0 /r/models/postprocessing 191.0 256
not a record
"""


def test_the_log_gives_each_stub_and_how_it_ended() -> None:
    records = {r.pid: r for r in read_stub_log(LOG)}
    assert list(records) == [11, 21, 31, 41, 51]
    cases = [  # pid, model, signal, exit code, clean, description (wait statuses as waitpid gives them)
        (11, "tensorrt_llm", None, 0, True, "stub pid=11 (tensorrt_llm_0_0): exit status 0"),
        (21, "tensorrt_llm_bls", signal.SIGKILL, None, False, "stub pid=21 (tensorrt_llm_bls_0_0): killed by SIGKILL"),
        (31, "preprocessing", None, None, False, "stub pid=31 (preprocessing_0_0): no exit recorded"),
        (41, "tensorrt_llm_bls", signal.SIGSEGV, None, False, "stub pid=41 (tensorrt_llm_bls_0_0): killed by SIGSEGV"),
        (51, "postprocessing", None, 1, False, "stub pid=51 (postprocessing_0_0): exit status 1"),
    ]
    for pid, model, sig, code, clean, text in cases:
        record = records[pid]
        assert (record.model, record.signal, record.exit_code, record.clean) == (model, sig, code, clean), pid
        assert record.describe() == text


@pytest.mark.parametrize(
    ("since_s", "dead"),
    [(0.0, [21, 41, 51]), (101.0, [41, 51]), (195.0, [])],
    ids=["every-server", "after-a-restart", "only-running-stubs"],
)
def test_dead_stubs_are_those_of_the_current_server_that_did_not_exit_0(since_s: float, dead: list[int]) -> None:
    assert [r.pid for r in dead_stubs(read_stub_log(LOG), since_s)] == dead


def test_a_running_stub_is_not_dead() -> None:
    running = StubRecord(1, 2, "m_0_0", "m", 5.0)
    assert running.wait_status is None and not running.clean and dead_stubs([running], 0.0) == []


class RecordingServer:
    """Stands in for a tritonserver the watchdog watches (``server.WorkerProcess``): records signals only."""

    def __init__(self, stubs: list[StubRecord]) -> None:
        self.stubs = stubs
        self.pid = 7
        self.started_at_s = 100.0
        self.signals: list[str] = []
        self.alive = True

    def running(self) -> bool:
        return self.alive

    def terminate(self) -> None:
        self.signals.append("TERM")

    def kill(self) -> None:
        self.signals.append("KILL")

    def restart(self) -> None:
        self.signals.append("restart")


def test_exit_sends_one_sigterm_then_sigkill_to_a_server_that_does_not_stop() -> None:
    """A server whose dead stub never unloads ignores its exit timeout: one SIGTERM, SIGKILL after the grace."""
    now = [1000.0]
    server = RecordingServer(read_stub_log(LOG))
    watchdog = StubWatchdog(server, "exit", poll_interval_s=1e6, kill_after_s=10.0, clock=lambda: now[0])
    try:
        for _ in range(5):  # polls while it keeps running: no second SIGTERM
            watchdog.poll()
            now[0] += 1.0
        assert server.signals == ["TERM"]
        assert [r.pid for r in watchdog.deaths] == [21, 41, 51]
        now[0] += 5.0  # 10 s after the SIGTERM
        watchdog.poll()
        assert server.signals == ["TERM", "KILL"]
        server.alive = False
        watchdog.poll()
        assert server.signals == ["TERM", "KILL"]
    finally:
        watchdog.close()


def test_restart_restarts_on_each_death_of_the_current_server() -> None:
    server = RecordingServer(read_stub_log(LOG))
    watchdog = StubWatchdog(server, "restart", poll_interval_s=1e6)
    try:
        watchdog.poll()
        assert server.signals == ["restart"]
        server.started_at_s = 200.0  # the new server: the old deaths are not its own
        watchdog.poll()
        assert server.signals == ["restart"]
    finally:
        watchdog.close()
