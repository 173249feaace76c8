"""The demand forecast (routing/forecast.py): recency, frequency and the diurnal shape, each from its own count."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
from trtfleet_router.routing.forecast import DemandForecast, ForecastConfig

pytestmark = pytest.mark.unit

DAY_S = 240.0  # a compressed day: 24 slices of 10 s
CONFIG = ForecastConfig(
    recent_half_life_s=5.0, steady_half_life_s=60.0, period_s=DAY_S, season_bins=24, season_weight=0.5, horizon_s=20.0
)


def feed(forecast: DemandForecast, task_id: int, rate_per_s: float, start_s: float, end_s: float) -> None:
    """Requests at a steady ``rate_per_s`` from ``start_s`` to ``end_s`` (evenly spaced)."""
    count = int(round((end_s - start_s) * rate_per_s))
    for i in range(count):
        forecast.record(task_id, start_s + (i + 0.5) / rate_per_s)


@dataclass(frozen=True)
class Case:
    id: str
    bursts: tuple[tuple[float, float, float], ...]  # (rate, start, end)
    at_s: float
    signal: str  # recent | steady | rate
    expected: float
    rel: float = 0.1


CASES = [
    # a steady rate shows in the recent and the steady counts alike once several half-lives have passed
    Case("steady-rate-recent", ((4.0, 0.0, 200.0),), 200.0, "recent", 4.0),
    Case("steady-rate-steady", ((4.0, 0.0, 200.0),), 200.0, "steady", 4.0),
    # a new adapter is not underestimated by a count that has not ramped up yet
    Case("new-adapter-steady", ((4.0, 0.0, 20.0),), 20.0, "steady", 4.0, rel=0.2),
    # recency: a burst that just ended is hot now, and has halved one recent half-life later
    Case("burst-recent", ((10.0, 90.0, 100.0),), 105.0, "recent", 10.0 * (1 - 2 ** -2) * 0.5, rel=0.05),
    # frequency: an hour-long habit outlasts a minute-long lull in the steady count
    Case("habit-through-a-lull", ((2.0, 0.0, 200.0),), 230.0, "steady", 2.0 * 2 ** (-30 / 60), rel=0.1),
    # the prediction is the largest signal: a burst's recent rate over a low steady rate
    Case("largest-signal", ((0.5, 0.0, 100.0), (20.0, 100.0, 110.0)), 110.0, "rate", 20.0 * (1 - 2 ** -2), rel=0.1),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_signals(case: Case) -> None:
    forecast = DemandForecast(CONFIG)
    for rate, start, end in case.bursts:
        feed(forecast, 7, rate, start, end)
    value = {
        "recent": forecast.recent_rate(7, case.at_s),
        "steady": forecast.steady_rate(7, case.at_s),
        "rate": forecast.rate(7, case.at_s),
    }[case.signal]
    assert value == pytest.approx(case.expected, rel=case.rel)


def test_the_seasonal_profile_predicts_the_usual_hour_before_it_comes() -> None:
    """An adapter busy in the same slice of each of two days is predicted busy ``horizon_s`` before that slice
    on the third day, while its recent and steady rates are near zero; an adapter seen less than a day has none."""
    forecast = DemandForecast(CONFIG)
    busy_start = 100.0  # slices 10 and 11 of each day: 100-120 s
    for day in range(2):
        feed(forecast, 1, 5.0, day * DAY_S + busy_start, day * DAY_S + busy_start + 20.0)
    feed(forecast, 2, 5.0, 2 * DAY_S - 30.0, 2 * DAY_S - 10.0)  # first seen 30 s before the third day
    before = 2 * DAY_S + busy_start - CONFIG.horizon_s + 1.0  # the horizon reaches slice 10 of day 3
    assert forecast.recent_rate(1, before) < 0.01
    assert forecast.steady_rate(1, before) < 1.0
    seasonal = forecast.seasonal_rate(1, before + CONFIG.horizon_s)
    assert seasonal is not None
    # slice 10 saw 5 req/s on day 2 (weight 0.5) and day 1 (0.5 x 0.5), folded at the day's end
    assert seasonal == pytest.approx(5.0 * (0.5 + 0.25), rel=0.05)
    assert forecast.rate(1, before) == pytest.approx(seasonal, rel=1e-9)
    assert forecast.seasonal_rate(2, before + CONFIG.horizon_s) is None
    # outside its usual hours the seasonal part adds nothing
    assert forecast.seasonal_rate(1, 2 * DAY_S + 200.0) == pytest.approx(0.0, abs=1e-9)


def test_days_without_traffic_fade_the_profile() -> None:
    forecast = DemandForecast(CONFIG)
    feed(forecast, 1, 4.0, 100.0, 110.0)
    feed(forecast, 9, 1.0, 0.0, 1.0)  # another adapter, so time moves on for the forecast's owner
    one_day = forecast.seasonal_rate(1, DAY_S + 105.0)
    three_days = forecast.seasonal_rate(1, 3 * DAY_S + 105.0)
    assert one_day is not None and three_days is not None
    assert three_days == pytest.approx(one_day * 0.5**2, rel=1e-9)


def test_retain_forgets_adapters_no_longer_registered() -> None:
    forecast = DemandForecast(CONFIG)
    for task_id in (1, 2, 3):
        forecast.record(task_id, 1.0)
    assert forecast.retain([1, 3]) == 1
    assert len(forecast) == 2
    assert forecast.rate(2, 1.0) == 0.0
    assert math.isclose(forecast.recent_rate(1, 1.0), math.log(2) / CONFIG.recent_half_life_s)
