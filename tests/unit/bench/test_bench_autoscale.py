"""The autoscaling benchmark's pure parts: traces, the baseline autoscalers' formulas, the controller's books."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

import pytest

from bench.autoscale import (
    POLICY_KEYS,
    Setup,
    Sizing,
    bound_goal_check,
    drawn_sizing,
    goal_check,
    policies,
    queue_attainment_at,
    traces,
    trtfleet_fleet,
)
from bench.podsim import PodSpec, StepTimeModel
from bench.scalers import FleetSignals, HoldWatchRule, KubeAiScaler, QueueScaler, TrtfleetScaler
from bench.scaletraces import ScaleTraceSpec, generate_scale_trace, mean_rate, rate_at
from bench.simscale import ColdStart, ScalingSimulation
from bench.simulate import FleetSpec
from bench.traces import TraceRequest
from trtfleet.api.autoscaling import AutoscalingSpec


@dataclass(frozen=True)
class RateCase:
    shape: str
    t_s: float
    rate: float


@pytest.mark.parametrize("case", [
    pytest.param(RateCase("diurnal", 0.0, 10.0), id="diurnal-trough-at-start"),
    pytest.param(RateCase("diurnal", 50.0, 100.0), id="diurnal-peak-at-half"),
    pytest.param(RateCase("diurnal", 25.0, 55.0), id="diurnal-midway"),
    pytest.param(RateCase("bursty", 10.0, 0.0), id="bursty-idle-before"),
    pytest.param(RateCase("bursty", 30.0, 100.0), id="bursty-burst"),
    pytest.param(RateCase("bursty", 80.0, 0.0), id="bursty-idle-after"),
    pytest.param(RateCase("shift", 70.0, 60.0), id="shift-constant"),
])
def test_rate_shapes(case: RateCase) -> None:
    spec = ScaleTraceSpec("t", case.shape, peak_rate_per_s=100.0, duration_s=100.0)
    assert rate_at(spec, case.t_s) == pytest.approx(case.rate)


def test_unknown_shape_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown shape"):
        ScaleTraceSpec("t", "square", peak_rate_per_s=1.0, duration_s=1.0)


@pytest.mark.parametrize("shape", ["diurnal", "bursty", "shift"])
def test_trace_is_seeded_sorted_and_near_its_mean_rate(shape: str) -> None:
    spec = ScaleTraceSpec("t", shape, peak_rate_per_s=50.0, duration_s=200.0, num_adapters=100, seed=3)
    trace = generate_scale_trace(spec)
    assert trace == generate_scale_trace(spec)
    times = [r.t_s for r in trace]
    assert times == sorted(times) and 0.0 <= times[0] and times[-1] < spec.duration_s
    expected = mean_rate(spec) * spec.duration_s
    assert abs(len(trace) - expected) < 5 * math.sqrt(expected)  # Poisson: five standard deviations
    assert all(int(r.adapter[1:]) < spec.num_adapters for r in trace)


def test_bursty_trace_is_silent_outside_the_burst() -> None:
    spec = ScaleTraceSpec("t", "bursty", peak_rate_per_s=20.0, duration_s=100.0, seed=1)
    assert all(20.0 <= r.t_s < 55.0 for r in generate_scale_trace(spec))


def test_shift_changes_the_hot_adapter() -> None:
    spec = ScaleTraceSpec("t", "shift", peak_rate_per_s=100.0, duration_s=100.0, num_adapters=1000, seed=2)
    trace = generate_scale_trace(spec)
    before = Counter(r.adapter for r in trace if r.t_s < 50.0).most_common(1)[0][0]
    after = Counter(r.adapter for r in trace if r.t_s >= 50.0).most_common(1)[0][0]
    assert before == "a0000" and after != before


@dataclass(frozen=True)
class HpaCase:
    waiting_per_pod: float
    current: int
    desired: int


@pytest.mark.parametrize("case", [
    pytest.param(HpaCase(2.0, 4, 8), id="twice-the-target-doubles"),
    pytest.param(HpaCase(1.05, 10, 10), id="within-tolerance-keeps"),
    pytest.param(HpaCase(0.0, 10, 0), id="no-queue-asks-for-none"),
    pytest.param(HpaCase(1.5, 3, 5), id="rounds-up"),
])
def test_queue_scaler_formula(case: HpaCase) -> None:
    assert QueueScaler(1.0, max_pods=64).desired(case.waiting_per_pod, case.current) == case.desired


def test_queue_scaler_scales_down_to_the_window_maximum() -> None:
    scaler = QueueScaler(1.0, max_pods=64, scale_down_window_s=300.0)
    assert scaler.decide(FleetSignals(pod_queued=16), current=4, now_s=0.0) == 16
    assert scaler.decide(FleetSignals(), current=16, now_s=100.0) == 16  # 16 recommended 100 s ago
    assert scaler.decide(FleetSignals(), current=16, now_s=301.0) == 1  # window passed: the floor, 1 pod
    assert scaler.decide(FleetSignals(held_requests=3), current=0, now_s=400.0) == 1


def test_kubeai_averages_from_zeros_and_waits_for_consecutive_downs() -> None:
    scaler = KubeAiScaler(target_requests=10, max_pods=64, interval_s=10, time_window_s=40, scale_down_delay_s=20)
    assert (scaler.window_count, scaler.required_downs) == (4, 2)
    assert scaler.decide(FleetSignals(router_requests=80), current=1, now_s=0) == 2  # (0+0+0+80)/4 = 20
    assert scaler.decide(FleetSignals(router_requests=80), current=2, now_s=10) == 4
    for now_s in (20, 30):
        assert scaler.decide(FleetSignals(router_requests=80), current=8, now_s=now_s) == 8
    assert scaler.decide(FleetSignals(), current=8, now_s=40) == 8  # average 6 -> 6: first down, held
    assert scaler.decide(FleetSignals(), current=8, now_s=50) == 8  # second
    assert scaler.decide(FleetSignals(), current=8, now_s=60) == 2  # third: (80+0+0+0)/4 = 20 -> 2


def test_trtfleet_scaler_calls_decide_and_scales_from_zero() -> None:
    spec = AutoscalingSpec(min_replicas=0, max_replicas=8, target_requests_per_pod=4)
    scaler = TrtfleetScaler(spec, lora_pages_per_pod=10)
    assert scaler.decide(FleetSignals(router_requests=9, held_requests=9), current=0, now_s=0.0) == 3
    assert scaler.last_reason == "ScaledFromZero"
    assert scaler.decide(FleetSignals(router_requests=4, ready_pods=3, active_adapter_pages=45), 3, 10.0) == 5


# -- the controller's books on a tiny deterministic fleet --------------------------------------------------
FLAT = StepTimeModel(name="flat", fixed_s=0.01, per_seq_s=0.0, per_context_token_s=0.0, per_prefill_token_s=0.0)
TINY = FleetSpec(pods=0, pod=PodSpec(host_pages=4, device_pages=4, page_bytes=1000, kv_capacity_tokens=100_000),
                 model=FLAT, adapter_pages=1, adapter_weights_bytes=1000,
                 add_decision_time=False)  # wall time of a decision would make the times below flaky under load


@dataclass
class ScriptedScaler:
    """Pods by time: the last ``(from_s, pods)`` whose ``from_s`` has passed."""

    script: tuple[tuple[float, int], ...]
    interval_s: float = 10.0
    name: str = "scripted"

    def decide(self, signals: FleetSignals, current: int, now_s: float) -> int:
        return [pods for from_s, pods in self.script if from_s <= now_s][-1]


def test_controller_cold_starts_drains_and_holds() -> None:
    trace = [
        TraceRequest(0.2, "held-at-start", "a", prompt_tokens=10, max_tokens=3),
        TraceRequest(25.0, "long", "b", prompt_tokens=10, max_tokens=1000),  # 10 s: still running at 30
        TraceRequest(32.0, "held-after-drain", "a", prompt_tokens=10, max_tokens=3),
    ]
    sim = ScalingSimulation(
        trace, TINY, ScriptedScaler(((0.0, 1), (30.0, 0), (40.0, 1), (50.0, 0))), initial_pods=0,
        duration_s=60.0, cold_start=ColdStart(engine_bytes=0, load_s=5.0),
    )
    run = sim.run_scaled()
    records = {trace[r.key].request_id: r for r in run.result.records}
    assert all(r.error is None for r in records.values())
    assert records["held-at-start"].ttft_s == pytest.approx(4.8, abs=0.1)  # ready at 5.0; + fetch, link, step
    assert records["held-after-drain"].ttft_s == pytest.approx(13.0, abs=0.1)  # second pod ready at 45
    assert records["long"].e2e_s == pytest.approx(10.0, abs=0.1)  # the drain let it finish
    assert run.held_requests == 2
    # the first pod leaves at the first scrape after its last request (35.0x -> 36), the second at 51
    assert run.timeline == [(0.0, 0), (0.0, 1), (36.0, 0), (40.0, 1), (51.0, 0)]
    assert run.pod_seconds == pytest.approx(36.0 + 11.0)
    assert run.scale_events == 4 and run.peak_pods == 1


def test_held_request_fails_after_the_hold_wait() -> None:
    trace = [TraceRequest(1.0, "r", "a", prompt_tokens=10, max_tokens=3)]
    sim = ScalingSimulation(trace, TINY, ScriptedScaler(((0.0, 0),)), initial_pods=0, duration_s=20.0,
                            hold_wait_s=5.0)
    run = sim.run_scaled()
    assert [r.error for r in run.result.records] == ["held_timeout"]
    assert run.pod_seconds == 0.0


def test_queue_attainment_is_interpolated_between_its_runs() -> None:
    rows = [{"policy": "queue-only (waiting/pod 1)", "pod_seconds": 100, "attainment": 0.9},
            {"policy": "queue-only (waiting/pod 4)", "pod_seconds": 200, "attainment": 1.0},
            {"policy": "trtfleet", "pod_seconds": 150, "attainment": 0.99}]
    assert queue_attainment_at(rows, 150) == pytest.approx(0.95)
    assert queue_attainment_at(rows, 250) is None


def test_run_ends_after_the_grace_and_open_requests_fail() -> None:
    trace = [TraceRequest(1.0, "endless", "a", prompt_tokens=10, max_tokens=50_000)]  # 500 s of steps
    sim = ScalingSimulation(trace, TINY, ScriptedScaler(((0.0, 1),)), initial_pods=1, duration_s=10.0, grace_s=5.0)
    run = sim.run_scaled()
    assert [r.error for r in run.result.records] == ["unfinished"]
    assert run.result.sim_end_s == pytest.approx(15.0)
    assert run.pod_seconds == pytest.approx(10.0)


def test_goal_check_states_met_missed_and_dominance() -> None:
    rows = [{"policy": "queue-only (waiting/pod 1)", "pod_seconds": 900, "attainment": 0.9},
            {"policy": "queue-only (waiting/pod 4)", "pod_seconds": 800, "attainment": 0.95},
            {"policy": "trtfleet (a)", "pod_seconds": 600, "attainment": 0.995},
            {"policy": "trtfleet (b)", "pod_seconds": 850, "attainment": 0.999}]
    first, second = goal_check(rows, static_peak_pod_s=1000)
    assert first.startswith("trtfleet (a): 40% fewer") and ": met;" in first and "every queue-only run" in first
    assert ": missed;" in second and "equal pod-seconds 92.50%: better (+7.40%)" in second
    (alone,) = goal_check(rows[2:3], static_peak_pod_s=1000)  # a run of a subset of the policies
    assert alone.endswith("no queue-only run to compare")


def _hot_trace() -> list[TraceRequest]:
    """Adapter ``a`` hot (5 requests), ``b`` once, all before 4 s."""
    return [TraceRequest(0.5 + 0.5 * i, f"a{i}", "a", prompt_tokens=10, max_tokens=3) for i in range(5)] + [
        TraceRequest(3.9, "b0", "b", prompt_tokens=10, max_tokens=3)]


@pytest.mark.parametrize("warm_start", [True, False])
def test_a_new_pod_takes_traffic_with_the_hottest_adapters_warm(warm_start: bool) -> None:
    sim = ScalingSimulation(
        sorted(_hot_trace(), key=lambda r: r.t_s), TINY, ScriptedScaler(((0.0, 1), (5.0, 2))), initial_pods=1,
        duration_s=20.0, cold_start=ColdStart(engine_bytes=0, load_s=5.0), warm_start=warm_start,
    )
    run = sim.run_scaled()
    assert all(r.error is None for r in run.result.records)
    new_pod = "pod-s0000"
    warm = {name for name in ("a", "b") if sim.fleet.is_warm(new_pod, sim.refs[name].task_id)}
    stored = {name for name in ("a", "b") if sim.refs[name].task_id in sim.pods[new_pod].cache.resident()}
    assert (warm, stored, sim.prewarmed) == (({"a", "b"}, {"a", "b"}, 2) if warm_start else (set(), set(), 0))


def test_scale_down_removes_the_pod_whose_warm_adapters_carry_least_demand() -> None:
    trace = sorted(_hot_trace(), key=lambda r: r.t_s)
    sim = ScalingSimulation(trace, TINY, ScriptedScaler(((0.0, 2), (10.0, 1))), initial_pods=2, duration_s=20.0,
                            least_valuable=True)
    run = sim.run_scaled()
    assert all(r.error is None for r in run.result.records)
    holders = {p for p, pod in sim.pods.items() if sim.refs["a"].task_id in pod.cache.resident()}
    assert sim.ready == holders and len(holders) == 1  # the pod warm with the hot adapter stayed


def test_paced_release_sends_held_requests_as_pods_absorb_them() -> None:
    trace = [TraceRequest(0.1 * (i + 1), f"h{i}", "a", prompt_tokens=10, max_tokens=300) for i in range(5)]
    trace.append(TraceRequest(5.5, "later", "a", prompt_tokens=10, max_tokens=3))
    sim = ScalingSimulation(trace, TINY, ScriptedScaler(((0.0, 1),)), initial_pods=0, duration_s=30.0,
                            cold_start=ColdStart(engine_bytes=0, load_s=5.0), release_per_pod=2)
    run = sim.run_scaled()
    records = {trace[r.key].request_id: r for r in run.result.records}
    assert all(r.error is None for r in records.values()) and run.held_requests == 5
    first = sorted(records[f"h{i}"].ttft_s or math.inf for i in range(5))
    # two go at 5 s; the rest only once those finish (300 steps of 10 ms = 3 s), in pairs; "later", arriving
    # with a pod ready, is routed at once (the backlog waits for room, not the arrival)
    assert first[1] < 5.5 and first[2] > 7.5 and first[4] > 10.5
    assert (records["later"].ttft_s or math.inf) < 0.5


def test_policy_keys_select_their_rows_and_one_queue_target_alone() -> None:
    setup = Setup(peak_pods=4, duration_s=60.0, seed=1)
    labels = [label for label, _, _ in policies(setup, drawn_sizing(traces(setup, 1.0)[0], 1.0))]
    picked = {key: [label for label in labels if label.startswith(prefix)] for key, prefix in POLICY_KEYS.items()}
    assert picked["queue-only"] == ["queue-only (waiting/pod 1)", "queue-only (waiting/pod 4)"]
    assert picked["queue-only-1"] == ["queue-only (waiting/pod 1)"]
    assert picked["queue-only-4"] == ["queue-only (waiting/pod 4)"]
    assert picked["foresight"] == []  # the bound's replay: a real trace's row, not a policy of its own
    assert all(len(rows) == 1 for key, rows in picked.items() if key not in {"queue-only", "foresight"})


def test_a_traces_sizing_reaches_every_policy() -> None:
    """A real trace's calibrated target goes to trtfleet (its spec and its held-request pacing) and KubeAI; the
    start and average pods to the fleets they size."""
    setup = Setup(peak_pods=8, duration_s=60.0, seed=1)
    rows = {label: (scaler, initial) for label, scaler, initial in policies(setup, Sizing(2.3, 3, 12.5))}
    assert rows["static peak"][1] == 8 and rows["static average"][1] == 3
    assert all(initial == 3 for label, (_, initial) in rows.items() if not label.startswith("static"))
    kubeai = rows["kubeai (in-flight avg 10 min)"][0]
    assert isinstance(kubeai, KubeAiScaler) and kubeai.target_requests == 12.5
    trtfleet = rows["trtfleet (requests, KV)"][0]
    assert isinstance(trtfleet, TrtfleetScaler) and trtfleet.spec.target_requests_per_pod == 12.5
    assert trtfleet.hold_watch is not None and trtfleet.hold_watch.per_pod == 12.5
    assert trtfleet_fleet(12.5)["release_per_pod"] == 12
    queue = rows["queue-only (waiting/pod 1)"]
    assert policies(setup, Sizing(0.0, 1))[2][2] == 1 and queue[1] == 3  # queue-only never starts below 1 pod


def test_bound_goal_is_within_ten_percent_at_99_percent() -> None:
    rows = [
        {"policy": "static peak", "pod_seconds": 200.0, "attainment": 1.0},
        {"policy": "trtfleet (a)", "pod_seconds": 110.0, "attainment": 0.99},
        {"policy": "trtfleet (b)", "pod_seconds": 111.0, "attainment": 1.0},
        {"policy": "trtfleet (c)", "pod_seconds": 100.0, "attainment": 0.985},
    ]
    lines = bound_goal_check(rows, 100.0)
    assert [line.split("attainment: ")[1].split(" ")[0] for line in lines] == ["met", "missed", "missed"]
    assert lines[0].startswith("trtfleet (a): +10% pod-seconds against the bound at 99.00% attainment")


@pytest.mark.parametrize("watch", [True, False], ids=["hold watch", "timer only"])
def test_the_operators_hold_watch_scales_from_zero_at_once_and_sizes_the_backlog_as_it_grows(watch: bool) -> None:
    spec = AutoscalingSpec(min_replicas=0, max_replicas=8, target_requests_per_pod=4)
    rule = HoldWatchRule(per_pod=4) if watch else None
    scaler = TrtfleetScaler(spec, lora_pages_per_pod=4, interval_s=30.0, hold_watch=rule)
    trace = [TraceRequest(3.2, "first", "a", prompt_tokens=10, max_tokens=3)]
    trace += [TraceRequest(5.1 + 0.05 * i, f"backlog{i}", "a", prompt_tokens=10, max_tokens=3) for i in range(10)]
    sim = ScalingSimulation(trace, TINY, scaler, initial_pods=0, duration_s=60.0,
                            cold_start=ColdStart(engine_bytes=0, load_s=5.0))
    run = sim.run_scaled()
    records = {trace[r.key].request_id: r for r in run.result.records}
    assert all(r.error is None for r in records.values()) and run.held_requests == 11
    if watch:
        # the first held request is decided on at the next scrape (4 s: 1 pod, covering 4 held); 11 held is
        # more than that covers, so the next scrape after the gap sizes the backlog: 3 pods
        assert run.timeline[:3] == [(0.0, 0), (4.0, 1), (6.0, 3)]
        assert records["first"].ttft_s == pytest.approx(5.8, abs=0.1)  # ready at 9
        assert sim.watch_decisions == 2
    else:  # the timer's next tick, at 30 s, is the first to see them
        assert run.timeline[:2] == [(0.0, 0), (30.0, 3)]
        assert records["first"].ttft_s == pytest.approx(31.8, abs=0.1)
        assert sim.watch_decisions == 0
